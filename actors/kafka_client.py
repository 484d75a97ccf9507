"""kafka-python behind the sink's client contract.

Contract (shared with the librdkafka client): ``produce(records, ticket, on_delivery)`` hands
records over and calls ``on_delivery(ticket, result)`` once per record from the
client's thread (``result`` is an exception when delivery failed); ``produce_sync`` sends one record and returns when it is durable;
``ensure_topics``; ``flush``; ``close(timeout)``; ``map_error(exc) -> SinkError``.
The producer is idempotent with acks=all, which keeps per-partition order across retries.
"""

from __future__ import annotations

import kafka.errors as kerr
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from router.errors import ConfigError, RecordTooLarge, SinkError, SinkRejected, SinkUnavailable

DEFAULTS = {
    "linger_ms": 5,
    "batch_size": 256 * 1024,
    "max_in_flight_requests_per_connection": 5,
    "delivery_timeout_ms": 60_000,
    "request_timeout_ms": 30_000,
}

_TOO_LARGE = tuple(getattr(kerr, n) for n in ("MessageSizeTooLargeError", "RecordTooLargeError",
                                             "RecordListTooLargeError") if hasattr(kerr, n))
_UNAVAILABLE = tuple(getattr(kerr, n) for n in ("NoBrokersAvailable", "KafkaConnectionError",
                                               "KafkaTimeoutError", "NodeNotReadyError")
                     if hasattr(kerr, n))


def map_error(exc: BaseException) -> SinkError:
    """Kafka errors → the router's tree, by type (and Kafka's own retriable flag)."""
    if isinstance(exc, SinkError):
        return exc
    if isinstance(exc, _TOO_LARGE):
        return RecordTooLarge(f"a record is larger than the topic accepts: {exc}")
    if isinstance(exc, _UNAVAILABLE) or getattr(exc, "retriable", False):
        return SinkUnavailable(f"Kafka unavailable: {exc}")
    if isinstance(exc, kerr.KafkaError):
        return SinkRejected(f"Kafka refused the records: {exc}")
    return SinkUnavailable(f"Kafka client failed: {exc!r}")


class KafkaPythonClient:
    def __init__(self, bootstrap_servers, settings: dict | None = None):
        config = dict(DEFAULTS)
        config.update(settings or {})
        self._admin_config = {k: v for k, v in config.items()
                              if k.startswith(("security_", "ssl_", "sasl_")) or k == "client_id"}
        self.bootstrap_servers = bootstrap_servers
        try:
            self.producer = KafkaProducer(bootstrap_servers=bootstrap_servers, acks="all",
                                          enable_idempotence=True, **config)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"unsupported Kafka client setting: {exc}",
                              path="kafka.settings") from exc
        except kerr.KafkaConfigurationError as exc:
            raise ConfigError(f"{exc}", path="kafka.settings") from exc
        except Exception as exc:
            raise map_error(exc) from exc
        self._known_topics: set[str] = set()

    map_error = staticmethod(map_error)

    def produce(self, records, ticket, on_delivery) -> None:
        send = self.producer.send
        try:
            for topic, key, value, headers in records:
                send(topic, value=value, key=key, headers=headers).add_both(on_delivery, ticket)
        except Exception as exc:
            raise map_error(exc) from exc

    def produce_sync(self, topic: str, key: bytes, value: bytes, timeout: float = 60.0) -> None:
        try:
            self.producer.send(topic, value=value, key=key).get(timeout=timeout)
        except Exception as exc:
            raise map_error(exc) from exc

    def ensure_topics(self, specs) -> None:
        missing = [s for s in specs if s.name not in self._known_topics]
        if not missing:
            return
        try:
            admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers,
                                     client_id="pgrouter-admin", **self._admin_config)
        except Exception as exc:
            raise map_error(exc) from exc
        try:
            existing = set(admin.list_topics())
            new = [NewTopic(s.name, s.partitions, s.replication_factor,
                            topic_configs=dict(s.configs))
                   for s in missing if s.name not in existing]
            if new:
                try:
                    admin.create_topics(new)
                except kerr.TopicAlreadyExistsError:
                    pass
        except Exception as exc:
            raise map_error(exc) from exc
        finally:
            admin.close()
        self._known_topics.update(s.name for s in missing)

    def flush(self, timeout: float | None = None) -> None:
        try:
            self.producer.flush(timeout=timeout)
        except Exception as exc:
            raise map_error(exc) from exc

    def close(self, timeout: float = 10.0) -> None:
        try:
            self.producer.close(timeout=timeout)
        except Exception:  # closing after a failure: what is lost was never confirmed
            pass
