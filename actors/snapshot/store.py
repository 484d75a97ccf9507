"""Snapshot progress in a compacted Kafka topic (``[snapshot] progress_topic``).

Why Kafka and not a table in the source: the router needs no write access and no DDL on
the source database, a progress table would itself be streamed by every FOR ALL TABLES
publication, and progress lives on the cluster that holds the records it describes.

Rules:

* A progress record is written with ``produce_sync`` (acknowledged, acks=all) only after
  every record it declares done is acknowledged; so after a ``kill -9`` what the topic says
  is done is in Kafka, and at most the chunk in flight is written again.
* Records are keyed (``router.snapshot.progress_key``): the topic is compacted and read from
  the beginning at start, the last record of a key wins.
* The blocking methods run in a worker thread.
"""

from __future__ import annotations

import trio

from router.config import Config
from router.errors import SinkUnavailable
from router.kafka_settings import KAFKA_PYTHON, translate
from router.snapshot import Progress, decode_progress, encode_progress, progress_key

from router.topics import TopicSpec
from ..kafka.versions import known_api_version


def _consumer_settings(cfg: Config) -> dict:
    """The connection settings (security, SASL, SSL) a kafka-python consumer shares with the
    producer."""
    settings = translate(dict(cfg.kafka.settings), KAFKA_PYTHON) if cfg.kafka.client == \
        KAFKA_PYTHON else {}
    return {k: v for k, v in settings.items() if k.startswith(("security_", "ssl_", "sasl_"))}


class ProgressStore:
    def __init__(self, cfg: Config, client):
        self.cfg = cfg
        self.topic = cfg.snapshot.progress_topic
        self.client = client  # the sink's Kafka client (produce_sync, ensure_topics)
        self.records: dict[bytes, Progress] = {}

    def load(self, timeout: float = 30.0) -> dict[bytes, Progress]:
        """Every progress record (last per key), read from the beginning to the end (with
        the library the router produces with)."""
        self._ensure()
        if self.cfg.kafka.client == "librdkafka":
            from ..kafka.admin import read_rdkafka

            try:
                pairs = read_rdkafka(self.cfg.kafka.bootstrap_servers,
                                     dict(self.cfg.kafka.settings), self.topic, timeout)
            except Exception as exc:  # noqa: BLE001 — Kafka is not usable
                raise SinkUnavailable(f"cannot read {self.topic}: {exc}") from exc
            out = {}
            for key, value in pairs:
                p = decode_progress(value)
                if p is not None and key:
                    out[key] = p
            self.records = out
            return out
        from kafka import KafkaConsumer, TopicPartition

        try:
            consumer = KafkaConsumer(bootstrap_servers=self.cfg.kafka.bootstrap_servers,
                                     group_id=None, enable_auto_commit=False,
                                     auto_offset_reset="earliest",
                                     **_consumer_settings(self.cfg),
                                     **known_api_version(self.cfg.kafka.bootstrap_servers))
        except Exception as exc:
            raise SinkUnavailable(f"cannot read {self.topic}: {exc}") from exc
        try:
            tp = TopicPartition(self.topic, 0)
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            end = consumer.end_offsets([tp])[tp]
            out: dict[bytes, Progress] = {}
            import time

            deadline = time.monotonic() + timeout
            while consumer.position(tp) < end:
                if time.monotonic() > deadline:
                    raise SinkUnavailable(f"timed out reading progress topic {self.topic}")
                for msgs in consumer.poll(timeout_ms=500).values():
                    for m in msgs:
                        p = decode_progress(m.value)
                        if p is not None and m.key:
                            out[m.key] = p
            self.records = out
            return out
        finally:
            consumer.close()

    def _ensure(self) -> None:
        if self.cfg.kafka.create_topics:
            rf = max([r.topic_settings.replication_factor for r in self.cfg.routes] or [1])
            self.client.ensure_topics([TopicSpec(self.topic, 1, rf,
                                                 {"cleanup.policy": "compact"})])

    def get(self, key: Progress) -> Progress | None:
        return self.records.get(progress_key(key))

    def put(self, p: Progress) -> None:
        key, value = encode_progress(p)
        self.client.produce_sync(self.topic, key, value)
        self.records[key] = p

    async def aput(self, p: Progress) -> None:
        await trio.to_thread.run_sync(self.put, p)

    async def aload(self) -> dict[bytes, Progress]:
        return await trio.to_thread.run_sync(self.load)
