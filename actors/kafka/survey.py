"""Looking at topics from outside the pipeline: each topic's offsets and the commit time of
its newest record (``pgrouter status``), and today's end offsets (the demo's starting point).
One kafka-python consumer per look, without a group, reading committed records only, with
the config's connection settings (``[kafka.settings]`` security, SASL, SSL, client id).

Rules:

* A topic's ``records`` is its offsets (end minus start, summed over partitions): counting
  what a read_committed consumer reads would mean reading the whole topic. Without Kafka
  transactions that is the record count; a topic written in Kafka transactions also holds a
  commit marker per partition per transaction (and the records of aborted ones), which take
  offsets but are never delivered: its ``records`` is an upper bound (``records_exact``
  false), and its newest record is looked for among the last ``TAIL`` offsets.
* A broker that accepts connections and never answers is ``SinkUnavailable`` after
  ``BOOTSTRAP_TIMEOUT``, not the client's 30 s; one whose TLS or SASL handshake fails is
  ``SinkUnavailable`` naming the protocol and the failure (``bootstrap_failures``).
* Blocking: run it in a worker thread.
"""

from __future__ import annotations

import json
from typing import Callable

from router.errors import PgRouterError, SinkUnavailable

from .bootstrap_failures import describe, security, watching
from .compacted import kafka_python_conf
from .versions import known_api_version

KAFKA_TIMEOUT = 10.0
#: seconds the first contact may take (kafka-python waits 30 s by default)
BOOTSTRAP_TIMEOUT = 4.0
#: offsets read back from each partition's end of a transactional topic for the newest commit
#: time (a Kafka transaction ends with a marker per partition)
TAIL = 20


def _consumer(bootstrap_servers, settings: dict, **extra):
    from kafka import KafkaConsumer
    from kafka.errors import KafkaTimeoutError

    conf = kafka_python_conf(settings)
    with watching() as failures:
        try:
            return KafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False,
                                 request_timeout_ms=int(KAFKA_TIMEOUT * 1000),
                                 bootstrap_timeout_ms=int(BOOTSTRAP_TIMEOUT * 1000),
                                 isolation_level="read_committed",
                                 **conf, **known_api_version(bootstrap_servers), **extra)
        except KafkaTimeoutError as exc:
            raise SinkUnavailable(_no_answer(bootstrap_servers, conf, failures)) from exc


def _no_answer(bootstrap_servers, conf: dict, failures: list) -> str:
    from kafka.errors import RequestTimedOutError

    servers = _servers(bootstrap_servers)
    # a request that timed out is the broker not answering, not a handshake refused
    failures = [f for f in failures if not isinstance(f, RequestTimedOutError)]
    if failures:  # the handshakes ``[kafka.settings]`` asks for, refused or failed
        return (f"{servers} could not be used within {BOOTSTRAP_TIMEOUT:.0f} s with "
                f"{describe(failures, conf)} (check [kafka.settings] against the listener)")
    with_security = f" with {security(conf)}" if "security_protocol" in conf else ""
    return (f"{servers} accepts connections but gave no Kafka answer within "
            f"{BOOTSTRAP_TIMEOUT:.0f} s{with_security} (a hung broker, or not Kafka?)")


def _servers(bootstrap_servers) -> str:
    return (bootstrap_servers if isinstance(bootstrap_servers, str)
            else ",".join(bootstrap_servers))


def survey(bootstrap_servers, settings: dict, groups: dict[str, Callable[[str], bool]],
           transactional: bool, decoder=None) -> dict[str, list[dict]]:
    """group name -> the topics it selects, each with its offsets, records and the newest
    record's commit time (``decoder``: ``registry.AvroDecoder`` for Avro topics)."""
    from kafka import TopicPartition

    consumer = _consumer(bootstrap_servers, settings, consumer_timeout_ms=2000)
    try:
        topics = sorted(consumer.topics())
        return {name: [_topic(consumer, TopicPartition, t, transactional, decoder)
                       for t in topics if selects(t)]
                for name, selects in groups.items()}
    finally:
        consumer.close()


def end_offsets(bootstrap_servers, topics: list[str], settings: dict | None = None
                ) -> dict[str, dict[int, int]]:
    """topic -> partition -> end offset now (a topic that does not exist: none)."""
    from kafka import TopicPartition

    consumer = _consumer(bootstrap_servers, settings or {})
    try:
        out: dict = {}
        for topic in topics:
            tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
            out[topic] = ({tp.partition: off for tp, off in consumer.end_offsets(tps).items()}
                          if tps else {})
        return out
    finally:
        consumer.close()


def _commit_time(value: bytes | None, decoder=None) -> str | None:
    """``source.commit_time`` of a record in pgrouter's format, Kafka Connect's or Avro."""
    try:
        if decoder is not None and value and value[:1] == b"\x00":
            return decoder.envelope(value)["source"].get("commit_time")
        doc = json.loads(value)
        source = (doc["payload"] if "payload" in doc and "schema" in doc else doc)["source"]
        return source.get("commit_time")
    except (ValueError, KeyError, TypeError, AttributeError, PgRouterError):
        return None


def _topic(consumer, TopicPartition, topic: str, transactional: bool, decoder=None) -> dict:
    """Offsets, records (the offsets: an upper bound when Kafka transactions write the topic,
    whose commit markers take offsets too) and the newest commit time among each partition's
    last records (the last offsets of a transactional topic are markers, not records)."""
    tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
    if not tps:
        return {"topic": topic, "offsets": 0, "records": 0, "records_exact": True,
                "last_commit_time": None}
    ends = consumer.end_offsets(tps)
    begins = consumer.beginning_offsets(tps)
    consumer.assign(tps)
    last = None
    for tp in tps:
        # the last two: a tombstone (no commit time) follows its delete (router.formats.tombstones)
        consumer.seek(tp, max(begins[tp], ends[tp] - (TAIL if transactional else 2)))
    for _ in range(10):
        for msgs in consumer.poll(timeout_ms=500).values():
            for m in msgs:
                t = _commit_time(m.value, decoder)
                if t is not None and (last is None or t > last):
                    last = t
        if all(consumer.position(tp) >= ends[tp] for tp in tps):
            break
    offsets = sum(ends[tp] - begins[tp] for tp in tps)
    return {"topic": topic, "offsets": offsets, "records": offsets,
            "records_exact": not transactional, "last_commit_time": last}




def records(bootstrap_servers, settings: dict, topic: str, *, tail: int | None = None):
    """(partition, offset, key, value) of ``topic``'s records up to its end offsets now
    (the last ``tail`` of each partition); a topic that does not exist raises."""
    from kafka import TopicPartition

    consumer = _consumer(bootstrap_servers, settings, consumer_timeout_ms=2000)
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise SinkUnavailable(f"topic {topic!r} does not exist at {bootstrap_servers}")
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        ends, begins = consumer.end_offsets(tps), consumer.beginning_offsets(tps)
        for tp in tps:
            consumer.seek(tp, begins[tp] if tail is None else max(begins[tp],
                                                                  ends[tp] - tail))
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            batch = consumer.poll(timeout_ms=1000)
            for tp, msgs in sorted(batch.items(), key=lambda kv: kv[0].partition):
                for m in msgs:
                    if m.offset < ends[tp]:
                        yield m.partition, m.offset, m.key, m.value
    finally:
        consumer.close()
