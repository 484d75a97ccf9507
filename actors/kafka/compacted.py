"""Reading a topic whole: every record from the beginning to the end the topic had when
asked. The one reader of the router's compacted topics (snapshot progress, publication
definitions, exactly-once progress). Looks at a topic's offsets and newest records are
``actors.kafka.survey``'s.

Rules:

* The end is each partition's end offset when the read starts; a partition is done when the
  consumer's position reaches it, not when its last record arrives: a topic written in Kafka
  transactions ends with a commit marker, which takes an offset but is never delivered.
* A topic that does not exist reads as no records; the read never creates it.
* ``library`` is the one the router produces with (``[kafka] client``): a router on
  librdkafka never imports kafka-python (a tenth of a second at every start).
  ``committed=True`` reads what a ``read_committed`` consumer sees, up to the last stable
  offset (kafka-python: its end offsets are that offset).
* ``key_has``: only the records whose key holds these bytes are kept (the others are read
  and dropped at once): a reader that wants one slot's records of a topic many routers
  share neither keeps nor decodes the rest.
* Failures are ``SinkUnavailable`` naming the topic; blocking: run it in a worker thread.
"""

from __future__ import annotations

import time

from router.errors import SinkUnavailable
from router.config.kafka_settings import KAFKA_PYTHON, LIBRDKAFKA, translate

from .versions import known_api_version

#: seconds a whole read may take by default
READ_TIMEOUT = 30.0


def read_topic(bootstrap_servers, settings: dict, topic: str, *, library: str = KAFKA_PYTHON,
               timeout: float = READ_TIMEOUT, committed: bool = False,
               key_has: bytes | None = None) -> list[tuple]:
    """Every ``(key, value)`` of ``topic`` (whose key holds ``key_has``, if given),
    partition after partition, in offset order."""
    try:
        if library == LIBRDKAFKA and not committed:
            return _read_rdkafka(bootstrap_servers, settings, topic, timeout, key_has)
        return _read_kafka_python(bootstrap_servers, settings, topic, timeout, committed,
                                  key_has)
    except SinkUnavailable:
        raise
    except TimeoutError as exc:
        raise SinkUnavailable(f"timed out reading {topic}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 — whatever the library raises: Kafka is not usable
        raise SinkUnavailable(f"cannot read {topic}: {exc}") from exc


def _read_rdkafka(bootstrap_servers, settings: dict, topic: str, timeout: float,
                  key_has: bytes | None) -> list:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from .admin import connection_conf

    conf = connection_conf(bootstrap_servers, settings)
    conf.pop("request.timeout.ms", None)  # a producer's setting: a consumer ignores it
    conf.update({"group.id": "pgrouter-reader", "enable.auto.commit": False,
                 "allow.auto.create.topics": False})
    consumer = Consumer(conf)
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return []
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
                for p in meta.partitions}
        left = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in left])
        read: dict[int, list] = {p: [] for p in sorted(left)}
        deadline = time.monotonic() + timeout
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the end was not reached in {timeout} s")
            for m in consumer.consume(5000, 0.05):
                p = m.partition()
                if m.error() is not None or p not in left or m.offset() >= ends[p]:
                    continue
                key = m.key()
                if key_has is None or (key is not None and key_has in key):
                    read[p].append((key, m.value()))
            for tp in consumer.position([TopicPartition(topic, p) for p in left]):
                if tp.offset >= ends[tp.partition]:
                    left.discard(tp.partition)
        return [kv for p in sorted(read) for kv in read[p]]
    finally:
        consumer.close()


def kafka_python_conf(settings: dict) -> dict:
    """The connection settings (security, SASL, SSL, client id) a kafka-python consumer
    shares with the producer, in kafka-python's names."""
    return {k: v for k, v in translate(dict(settings), KAFKA_PYTHON).items()
            if k.startswith(("security_", "ssl_", "sasl_")) or k == "client_id"}


def _read_kafka_python(bootstrap_servers, settings: dict, topic: str, timeout: float,
                       committed: bool, key_has: bytes | None) -> list:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=None,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             allow_auto_create_topics=False,
                             isolation_level="read_committed" if committed
                             else "read_uncommitted",
                             **kafka_python_conf(settings),
                             **known_api_version(bootstrap_servers))
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            return []
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        read: dict[int, list] = {tp.partition: [] for tp in tps}
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the end was not reached in {timeout} s")
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                read[tp.partition].extend(
                    (m.key, m.value) for m in msgs if m.offset < ends[tp]
                    and (key_has is None or (m.key is not None and key_has in m.key)))
        return [kv for p in sorted(read) for kv in read[p]]
    finally:
        consumer.close()
