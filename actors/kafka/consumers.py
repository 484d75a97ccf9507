"""The applier's Kafka side: a consumer over the transaction topic and the data topics its
END records name. Two clients behind one contract: librdkafka (confluent-kafka; the default
when installed: about 1 µs per record) and kafka-python. Every method blocks and is called
from one worker thread at a time (``trio.to_thread.run_sync``).

Rules: partitions are assigned by hand (no consumer group, no committed offsets: what was
applied is recorded only in the target, in the same transactions as the changes). ``start``
seeks every partition named in the stored restart positions there; partitions without one
(a topic new to this applier) are read from the beginning. Topics are never auto-created by
the consumer's metadata requests. ``fetched`` counts the records read.
"""

from __future__ import annotations

import fnmatch
import time

from router.config.applier import ApplyKafka
from router.errors import ConfigError, SinkUnavailable

POLL_RECORDS = 5000


def client_name(cfg: ApplyKafka) -> str:
    if cfg.client != "auto":
        return cfg.client
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return "kafka-python"
    return "librdkafka"


def open_reader(cfg: ApplyKafka) -> "TopicReader":
    return (RdkafkaReader if client_name(cfg) == "librdkafka" else KafkaPythonReader)(cfg)


class TopicReader:
    """What both clients share: which topics are wanted, where each partition starts."""

    def __init__(self, cfg: ApplyKafka):
        self.cfg = cfg
        self.transactions_topic = cfg.transactions_topic
        self._patterns = tuple(cfg.topics)
        self._wanted: dict[str, bool] = {}
        self._assigned: set[tuple[str, int]] = set()
        self._resume: dict[tuple[str, int], int] = {}
        self.fetched = 0

    def wants(self, topic: str) -> bool:
        found = self._wanted.get(topic)
        if found is None:  # asked for every END record: the globs are matched once a topic
            found = self._wanted[topic] = topic != self.transactions_topic and any(
                fnmatch.fnmatchcase(topic, p) for p in self._patterns)
        return found

    def start(self, resume: dict[str, int] | None) -> None:
        """Remember the restart positions; data topics in them are assigned right away."""
        for key, offset in (resume or {}).items():
            topic, _, part = key.rpartition("/")
            self._resume[(topic, int(part))] = offset
        topics = {t for t, _ in self._resume if t != self.transactions_topic and self.wants(t)}
        if topics:
            self.add_topics(sorted(topics), missing_ok=True)

    def wait_for_transactions_topic(self, timeout: float = 1.0) -> bool:
        """Assign the transaction topic once it exists (False: not yet, after waiting)."""
        if (self.transactions_topic, 0) in self._assigned:
            return True
        if self._partitions(self.transactions_topic):
            self._assign({(self.transactions_topic, 0)})
            return True
        time.sleep(timeout)
        return False

    def transactions_end_offset(self) -> int | None:
        """End offset of the transaction topic now (None: the topic does not exist)."""
        if not self._partitions(self.transactions_topic):
            return None
        self._assign({(self.transactions_topic, 0)})
        return self._end_offset(self.transactions_topic)

    def add_topics(self, topics: list[str], missing_ok: bool = False) -> None:
        tps = set()
        for topic in topics:
            parts = self._partitions(topic)
            if not parts:
                if missing_ok:
                    continue
                raise SinkUnavailable(f"topic {topic} named by the transaction topic does not "
                                      "exist (yet)")
            tps.update((topic, p) for p in parts)
        self._assign(tps)

    def _assign(self, tps: set[tuple[str, int]]) -> None:
        new = tps - self._assigned
        if new:
            self._assigned |= new
            self._assign_new({tp: self._resume.get(tp) for tp in sorted(new)})

    # per client
    def _partitions(self, topic: str) -> set[int]:
        raise NotImplementedError

    def _end_offset(self, topic: str) -> int:
        raise NotImplementedError

    def _assign_new(self, tps: dict[tuple[str, int], int | None]) -> None:
        raise NotImplementedError

    def poll(self) -> list[tuple[str, int, list[tuple[int, bytes | None]]]]:
        """The records read as runs of one partition: ``(topic, partition, [(offset,
        value), …])``, in partition order; waits up to ``poll_timeout`` for some."""
        raise NotImplementedError

    def poll_ready(self) -> list[tuple[str, int, list[tuple[int, bytes | None]]]] | None:
        """Records already fetched, without blocking; None: this client cannot tell (call
        ``poll`` in a worker thread)."""
        return None

    def close(self) -> None:
        try:
            self.consumer.close()
        except Exception:  # nothing to save: no offsets are committed
            pass


class RdkafkaReader(TopicReader):
    def __init__(self, cfg: ApplyKafka):
        super().__init__(cfg)
        from confluent_kafka import Consumer, KafkaException

        servers = cfg.bootstrap_servers
        conf = {"bootstrap.servers": servers if isinstance(servers, str) else ",".join(servers),
                # required by the client, never used: nothing subscribes or commits
                "group.id": "pgrouter-apply", "enable.auto.commit": False,
                "enable.auto.offset.store": False, "auto.offset.reset": "earliest",
                "allow.auto.create.topics": False, "enable.partition.eof": False,
                "fetch.wait.max.ms": 50,
                # librdkafka's default prefetch: with 16 MiB polls waited for the broker
                "queued.max.messages.kbytes": 64 * 1024,
                # once the queue is full (queued.min.messages, 100,000 records, or the
                # kbytes above), librdkafka's default postpones every partition's next
                # fetch by a whole second ("Fetch backoff for 1000ms: Local: Queue full"):
                # a backlog's BEGIN/END records alone fill it at a start, before the data
                # topic's first fetch, and this process drains it well within the second
                "fetch.queue.backoff.ms": 10,
                # as the producer's (librdkafka.DEFAULTS): the first metadata request of
                # a start is not held back by the reconnection to the broker's own address
                "reconnect.backoff.ms": 10, "socket.nagle.disable": True}
        conf.update(cfg.settings)
        try:
            self.consumer = Consumer(conf)
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConfigError(f"unsupported Kafka consumer setting: {exc}",
                              path="kafka.settings") from exc
        self._timeout = cfg.poll_timeout

    def _partitions(self, topic: str) -> set[int]:
        from confluent_kafka import KafkaException

        try:
            md = self.consumer.list_topics(topic, timeout=10)
        except KafkaException as exc:
            raise SinkUnavailable(f"Kafka unavailable: {exc}") from exc
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return set()
        return set(t.partitions)

    def _end_offset(self, topic: str) -> int:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            return self.consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        except KafkaException as exc:
            raise SinkUnavailable(f"Kafka unavailable: {exc}") from exc

    def _assign_new(self, tps: dict[tuple[str, int], int | None]) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self.consumer.incremental_assign([
            TopicPartition(t, p, OFFSET_BEGINNING if o is None else o)
            for (t, p), o in tps.items()])

    def poll_ready(self) -> list[tuple[str, int, list[tuple[int, bytes | None]]]] | None:
        """What librdkafka has already fetched, without waiting: cheap enough for the
        caller's own thread (no hop to a worker thread and back)."""
        return self.poll(0)

    def poll(self, timeout: float | None = None
             ) -> list[tuple[str, int, list[tuple[int, bytes | None]]]]:
        msgs = self.consumer.consume(POLL_RECORDS, self._timeout if timeout is None else timeout)
        out: list = []
        run: list = []
        last = None
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.fatal() or not err.retriable():
                    raise SinkUnavailable(f"Kafka consumer failed: {err.str()}")
                continue
            tp = (m.topic(), m.partition())
            if tp != last:
                run = []
                out.append((tp[0], tp[1], run))
                last = tp
            run.append((m.offset(), m.value()))
        self.fetched += len(msgs)
        return out


class KafkaPythonReader(TopicReader):
    def __init__(self, cfg: ApplyKafka):
        super().__init__(cfg)
        import kafka.errors as kerr
        from kafka import KafkaConsumer

        self._kerr = kerr
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

    def _partitions(self, topic: str) -> set[int]:
        try:
            self.consumer.topics()  # refreshes metadata of every topic
            return self.consumer.partitions_for_topic(topic) or set()
        except self._kerr.KafkaError as exc:
            raise SinkUnavailable(f"Kafka unavailable: {exc}") from exc

    def _end_offset(self, topic: str) -> int:
        from kafka import TopicPartition

        tp = TopicPartition(topic, 0)
        try:
            return self.consumer.end_offsets([tp])[tp]
        except self._kerr.KafkaError as exc:
            raise SinkUnavailable(f"Kafka unavailable: {exc}") from exc

    def _assign_new(self, tps: dict[tuple[str, int], int | None]) -> None:
        from kafka import TopicPartition

        self.consumer.assign(sorted(TopicPartition(t, p) for t, p in self._assigned))
        for (t, p), offset in tps.items():
            if offset is not None:
                self.consumer.seek(TopicPartition(t, p), offset)

    def poll(self) -> list[tuple[str, int, list[tuple[int, bytes | None]]]]:
        try:
            batches = self.consumer.poll(timeout_ms=int(self.cfg.poll_timeout * 1000),
                                         max_records=POLL_RECORDS)
        except self._kerr.KafkaError as exc:
            raise SinkUnavailable(f"Kafka consumer failed: {exc}") from exc
        out = []
        for tp, records in batches.items():
            out.append((tp.topic, tp.partition, [(r.offset, r.value) for r in records]))
            self.fetched += len(records)
        return out

