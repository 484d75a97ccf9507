"""kafka-python behind the sink's client contract.

Contract (shared with the librdkafka client): ``produce(records, ticket, on_done)`` hands
records over and calls ``on_done(ticket, error, count)`` once from the client's thread: when
every record is acknowledged (``error`` None, ``count`` = len(records)) or at the first
failure (``router.delivery.tally.Tally``); ``produce_sync`` sends one record and returns when it is
durable; ``ensure_topics``; ``flush``; ``close(timeout)``; ``map_error(exc) -> SinkError``.
The producer is idempotent with acks=all, which keeps per-partition order across retries.

Rules of the hot path (kafka-python spends all its time in Python, ~40 µs a record through
``send``):

* The partition is chosen here, per record, exactly as Kafka's default partitioner does
  (murmur2 of the key bytes, made positive, modulo the topic's partition count from the
  producer's metadata; a key of ``None`` goes to one partition per ``produce`` call, rotating),
  so keys land where the Java client and librdkafka's ``murmur2_random`` put them.
* Records go straight to the producer's accumulator: what ``send`` checks per record
  (types, headers, metadata, size) is known per call or checked once per call here. This
  uses kafka-python's internals (``_accumulator``, ``_sender``), pinned to 3.0.x; when they
  are missing the client falls back to ``send``.
* kafka-python's accumulator has no memory bound of its own: ``produce`` blocks while more
  than ``buffer_memory`` bytes of batches are unacknowledged (backpressure, as in librdkafka).
* A record above the producer's ``max_request_size`` or the topic's ``max.message.bytes``
  (read once per topic) is refused before sending, with a line naming it
  (``router.delivery.tally.record_too_large``): kafka-python's delivery errors do not say which
  record the broker refused.
* ``[kafka] settings`` use the common vocabulary of ``router.config.kafka_settings``.
"""

from __future__ import annotations

import itertools
import struct
import time
from collections.abc import Callable
from typing import Any

import kafka.errors as kerr
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import TopicPartition

from router.delivery.tally import Tally, record_too_large
from router.formats.tombstones import keyless_refused
from router.routing.topics import collision, twin_of
from router.errors import ConfigError, RecordTooLarge, SinkError, SinkRejected, SinkUnavailable
from router.config.kafka_settings import KAFKA_PYTHON, translate

from .admin import wait_led_kafka_python
from .contracts import Producer

DEFAULTS: dict[str, Any] = {
    "linger_ms": 5,
    "batch_size": 256 * 1024,
    "max_in_flight_requests_per_connection": 5,
    "delivery_timeout_ms": 60_000,
    "request_timeout_ms": 30_000,
}
#: unacknowledged batch bytes before ``produce`` waits (``buffer_memory``; ours, not kafka-python's)
BUFFER_MEMORY = 32 * 1024 * 1024
#: bytes a record adds to key+value+headers on the wire, at most (DefaultRecordBatch)
_RECORD_OVERHEAD = 61 + 21

_TOO_LARGE = (kerr.MessageSizeTooLargeError, kerr.RecordListTooLargeError)
_UNAVAILABLE = (kerr.KafkaConnectionError, kerr.KafkaTimeoutError, kerr.NodeNotReadyError)


def map_error(exc: BaseException) -> SinkError:
    """Kafka errors → the router's tree, by type (and Kafka's own retriable flag)."""
    if isinstance(exc, SinkError):
        return exc
    if isinstance(exc, _TOO_LARGE):
        return RecordTooLarge(f"a record is larger than Kafka accepts ({exc}): raise "
                              "[kafka.settings] max_request_size and the topic's "
                              "max.message.bytes")
    if isinstance(exc, kerr.InvalidRecordError):  # a keyless record, a compacted topic
        return keyless_refused(None, str(exc))
    if isinstance(exc, _UNAVAILABLE) or (isinstance(exc, kerr.KafkaError) and exc.retriable):
        return SinkUnavailable(f"Kafka unavailable: {exc}")
    if isinstance(exc, kerr.KafkaError):
        return SinkRejected(f"Kafka refused the records: {exc}")
    return SinkUnavailable(f"Kafka client failed: {exc!r}")


_blocks: dict[int, Callable[[bytes], tuple[int, ...]]] = {}


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``), unsigned 32 bit;
    the same values as ``kafka.partitioner.default.murmur2`` at about half the cost (the
    4-byte blocks are unpacked in one call)."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = 0x9747B28C ^ length
    n4 = length >> 2
    if n4:
        unpack = _blocks.get(n4)
        if unpack is None:
            unpack = _blocks[n4] = struct.Struct("<%dI" % n4).unpack_from
        for k in unpack(data):
            k = (k * m) & mask
            k ^= k >> 24
            h = ((h * m) & mask) ^ ((k * m) & mask)
    extra = length & 3
    if extra:
        base = length & ~3
        if extra == 3:
            h ^= data[base + 2] << 16
        if extra >= 2:
            h ^= data[base + 1] << 8
        h ^= data[base]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    return h ^ (h >> 15)


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for a non-null key."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


_CODECS = {"gzip": ("has_gzip", "(built in)"), "snappy": ("has_snappy", "python-snappy"),
           "lz4": ("has_lz4", "lz4"), "zstd": ("has_zstd", "zstandard")}


def check_codec(compression: str | None) -> None:
    """kafka-python compresses in Python: the codec's package must be installed."""
    if compression not in _CODECS:
        return
    import kafka.codec

    probe, package = _CODECS[compression]
    if not getattr(kafka.codec, probe)():
        raise ConfigError(f"{compression} with kafka-python needs the Python package "
                          f"{package} (or use client = \"librdkafka\")",
                          path="kafka.settings.compression_type")


class KafkaPythonClient(Producer):
    def __init__(self, bootstrap_servers, settings: dict | None = None, *,
                 transactional_id: str | None = None):
        config = dict(DEFAULTS)
        if transactional_id:  # actors.kafka.transactional drives the transactions
            config["transactional_id"] = transactional_id
        config.update(translate(dict(settings or {}), KAFKA_PYTHON))
        buffer_memory = config.pop("buffer_memory", BUFFER_MEMORY)
        # the first contact waits as long as any request (librdkafka has no separate limit)
        config["bootstrap_timeout_ms"] = config["request_timeout_ms"]
        self._admin_config = {k: v for k, v in config.items()
                              if k.startswith(("security_", "ssl_", "sasl_")) or k == "client_id"}
        self.bootstrap_servers = bootstrap_servers
        check_codec(config.get("compression_type"))
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
        pconf = self.producer.config
        self._max_record = pconf["max_request_size"]
        self._max_batches = max(2, buffer_memory // pconf["batch_size"])
        accumulator = getattr(self.producer, "_accumulator", None)
        sender = getattr(self.producer, "_sender", None)
        txn = getattr(self.producer, "_transaction_manager", None)
        self._fast = (accumulator is not None and sender is not None
                      and hasattr(accumulator, "_incomplete"))
        #: a transactional producer registers each partition with the transaction (as
        #: ``send`` does), once per ``produce`` call: a Kafka transaction spans whole calls
        self._txn_add = (txn.maybe_add_partition_to_transaction
                         if txn is not None and txn.is_transactional() else None)
        self._accumulator: Any = accumulator
        self._sender: Any = sender
        self._tps: dict[str, list[TopicPartition]] = {}
        self._rotation = itertools.count()
        self._known_topics: set[str] = set()
        self._listed: frozenset | None = None  # topic_names' (the outbox folds' start)
        self._topic_limits: dict[str, int | None] = {}
        self._admin: KafkaAdminClient | None = None

    map_error = staticmethod(map_error)

    @property
    def fatal(self) -> None:
        """kafka-python reports no fatal state: a failure is the exception of a call."""
        return None

    def _partitions(self, topic: str) -> list[TopicPartition]:
        """The topic's partitions (from the producer's metadata, refreshed by the producer;
        waits for it the first time, like ``send``)."""
        known = self.producer.partitions_for(topic)
        if not known:
            raise SinkUnavailable(f"no partitions known for topic {topic}")
        tps = self._tps.get(topic)
        if tps is None or len(tps) != len(known):
            tps = self._tps[topic] = [TopicPartition(topic, p) for p in sorted(known)]
        return tps

    def _wait_for_buffer(self) -> None:
        incomplete = self._accumulator._incomplete
        while len(incomplete._incomplete) > self._max_batches:
            self._sender.wakeup()
            time.sleep(0.002)

    def produce(self, records, ticket, on_done) -> None:
        tally = Tally(len(records), on_done, ticket)
        try:
            if not self._fast:
                return self._produce_with_send(records, tally)
            self._wait_for_buffer()
            ack, fail = tally.ack, tally.fail
            append = self._accumulator.append
            limit = self._max_record - _RECORD_OVERHEAD
            last_topic = None
            tps: list = []
            n = 1
            null_tp = None
            txn_add = self._txn_add
            added: set = set()
            for topic, key, value, headers in records:
                if topic is not last_topic:
                    tps = self._partitions(topic)
                    n = len(tps)
                    last_topic = topic
                    null_tp = tps[next(self._rotation) % n]
                    limit = self._limit(topic) - _RECORD_OVERHEAD
                if n == 1:
                    tp = tps[0]
                elif key is None:
                    tp = null_tp
                else:
                    tp = tps[(murmur2(key) & 0x7FFFFFFF) % n]
                if len(value or b"") + (len(key) if key is not None else 0) > limit:
                    self._check_size(topic, key, value, headers)
                if txn_add is not None and tp not in added:
                    txn_add(tp)
                    added.add(tp)
                future, full, new_batch, _ = append(tp, None, key, value,
                                                    [] if headers is None else headers)
                future._add_cb_eb(ack, fail)
                if full or new_batch:
                    self._sender.wakeup()
        except SinkError:
            raise
        except Exception as exc:
            raise map_error(exc) from exc

    def _check_size(self, topic, key, value, headers) -> None:
        size = self.producer._estimate_size_in_bytes(key, value, headers)
        if size > self._max_record:
            raise record_too_large(topic, key, value, headers=headers,
                                   producer_limit=self._max_record)
        topic_limit = self._topic_limits.get(topic)
        if topic_limit is not None and size > topic_limit:
            raise record_too_large(topic, key, value, headers=headers, topic_limit=topic_limit)

    def _limit(self, topic: str) -> int:
        """The largest record ``topic`` takes: ``max_request_size``, or the topic's
        ``max.message.bytes`` when smaller (read from Kafka once per topic; when it cannot
        be read the broker's refusal is reported instead)."""
        if topic not in self._topic_limits:
            self._topic_limits[topic] = self._read_topic_limit(topic)
        topic_limit = self._topic_limits[topic]
        return self._max_record if topic_limit is None else min(self._max_record, topic_limit)

    def _read_topic_limit(self, topic: str) -> int | None:
        from kafka.admin import ConfigResource, ConfigResourceType

        try:
            if self._admin is None:
                self._admin = self._new_admin()
            described = self._admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": None})],
                config_filter="all")
            return int(described["topic"][topic]["max.message.bytes"]["value"])
        except Exception:  # no rights to describe, an old broker: the broker still refuses
            return None

    def _produce_with_send(self, records, tally) -> None:
        send = self.producer.send
        for topic, key, value, headers in records:
            send(topic, value=value, key=key, headers=headers).add_callback(
                tally.ack).add_errback(tally.fail)

    def produce_sync(self, topic: str, key: bytes, value: bytes, timeout: float = 60.0) -> None:
        try:
            self.producer.send(topic, value=value, key=key).get(timeout=timeout)
        except _TOO_LARGE as exc:
            raise record_too_large(topic, key, value) from exc
        except Exception as exc:
            raise map_error(exc) from exc

    def _new_admin(self) -> KafkaAdminClient:
        return KafkaAdminClient(bootstrap_servers=self.bootstrap_servers,
                                client_id="pgrouter-admin", **self._admin_config)

    def _admin_client(self) -> KafkaAdminClient:
        """A new admin client (the caller closes it); failing to make one is a sink error."""
        try:
            return self._new_admin()
        except Exception as exc:
            raise map_error(exc) from exc

    def topic_names(self) -> frozenset[str]:
        admin = self._admin_client()
        try:
            self._listed = frozenset(admin.list_topics())
            return self._listed
        except Exception as exc:
            raise map_error(exc) from exc
        finally:
            admin.close()

    def ensure_topics(self, specs) -> set[str]:
        """As ``RdKafkaClient.ensure_topics``: made when missing, and every one, made or
        found, served by its leader before it is written to (asked once per topic and client)."""
        missing = [s for s in specs if s.name not in self._known_topics]
        created: set[str] = set()
        if not missing:
            return created
        admin = self._admin_client()
        try:
            existing = set(admin.list_topics())
            new = [NewTopic(s.name, s.partitions, s.replication_factor,
                            topic_configs=dict(s.configs))
                   for s in missing if s.name not in existing]
            for s in new:  # refused by Kafka with no word on the other topic
                twin = twin_of(s.name, existing)
                if twin is not None:
                    raise collision(s.name, twin, self._listed)
            if new:
                try:
                    admin.create_topics(new)
                    created.update(t.name for t in new)
                except kerr.TopicAlreadyExistsError:
                    pass
            found = [s.name for s in missing if s.name in existing]
            led = {d["name"]: len(d.get("partitions") or ())
                   for d in (admin.describe_topics(found) if found else ())}
            led.update((t.name, t.num_partitions) for t in new)
            # their first records wait for their leaders (``admin.wait_led``: else lost)
            wait_led_kafka_python(admin, led, self.producer.config["request_timeout_ms"] / 1000)
        except Exception as exc:
            raise map_error(exc) from exc
        finally:
            admin.close()
        self._known_topics.update(s.name for s in missing)
        return created

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
        if self._admin is not None:
            try:
                self._admin.close()
            except Exception:
                pass
