"""The applier's Kafka side: a kafka-python consumer over the transaction topic and the data
topics its END records name. Every method blocks and is called from one worker thread at a
time (``trio.to_thread.run_sync``).

Rules: partitions are assigned by hand (no consumer group, no committed offsets: the
target's replication origin is the only record of what was applied) and read from the
beginning; topics are never auto-created by the consumer's metadata requests.
"""

from __future__ import annotations

import fnmatch

import kafka.errors as kerr
from kafka import KafkaConsumer, TopicPartition

from router.apply_config import ApplyKafka
from router.errors import ConfigError, SinkUnavailable

POLL_RECORDS = 2000


class TopicReader:
    def __init__(self, cfg: ApplyKafka):
        self.cfg = cfg
        self.transactions_topic = cfg.transactions_topic
        self._patterns = tuple(cfg.topics)
        self._tx_tp = TopicPartition(cfg.transactions_topic, 0)
        self._assigned: set[TopicPartition] = set()
        try:
            self.consumer = KafkaConsumer(
                bootstrap_servers=cfg.bootstrap_servers, group_id=None,
                enable_auto_commit=False, auto_offset_reset="earliest",
                allow_auto_create_topics=False, **cfg.settings)
        except (TypeError, ValueError, kerr.KafkaConfigurationError) as exc:
            raise ConfigError(f"unsupported Kafka consumer setting: {exc}",
                              path="kafka.settings") from exc
        except kerr.KafkaError as exc:
            raise SinkUnavailable(f"Kafka unavailable: {exc}") from exc

    def wants(self, topic: str) -> bool:
        if topic in (self.transactions_topic,):
            return False
        return any(fnmatch.fnmatchcase(topic, p) for p in self._patterns)

    def _partitions(self, topic: str) -> set[int] | None:
        try:
            self.consumer.topics()  # refreshes metadata of every topic
            return self.consumer.partitions_for_topic(topic)
        except kerr.KafkaError as exc:
            raise SinkUnavailable(f"Kafka unavailable: {exc}") from exc

    def wait_for_transactions_topic(self, timeout: float = 1.0) -> bool:
        """Assign the transaction topic once it exists (False: not yet, after waiting)."""
        if self._tx_tp in self._assigned:
            return True
        if self._partitions(self.transactions_topic):
            self._assign({self._tx_tp})
            return True
        import time

        time.sleep(timeout)
        return False

    def transactions_end_offset(self) -> int | None:
        """End offset of the transaction topic now (None: the topic does not exist)."""
        if not self._partitions(self.transactions_topic):
            return None
        self._assign({self._tx_tp})
        try:
            return self.consumer.end_offsets([self._tx_tp])[self._tx_tp]
        except kerr.KafkaError as exc:
            raise SinkUnavailable(f"Kafka unavailable: {exc}") from exc

    def transactions_position(self) -> int:
        return self.consumer.position(self._tx_tp)

    def _assign(self, tps: set[TopicPartition]) -> None:
        new = tps - self._assigned
        if new:
            self._assigned |= new
            self.consumer.assign(sorted(self._assigned))

    def add_topics(self, topics: list[str]) -> None:
        tps = set()
        for topic in topics:
            parts = self._partitions(topic)
            if not parts:
                raise SinkUnavailable(f"topic {topic} named by the transaction topic does not "
                                      "exist (yet)")
            tps.update(TopicPartition(topic, p) for p in parts)
        self._assign(tps)

    def poll(self) -> list[tuple[str, int, bytes]]:
        """(topic, offset, value) of the records read, in partition order."""
        try:
            batches = self.consumer.poll(timeout_ms=int(self.cfg.poll_timeout * 1000),
                                         max_records=POLL_RECORDS)
        except kerr.KafkaError as exc:
            raise SinkUnavailable(f"Kafka consumer failed: {exc}") from exc
        out = []
        for tp, records in batches.items():
            out.extend((tp.topic, r.offset, r.value) for r in records)
        return out

    def close(self) -> None:
        try:
            self.consumer.close()
        except Exception:  # nothing to save: no offsets are committed
            pass
