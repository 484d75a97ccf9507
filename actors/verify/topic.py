"""Reading a route's topic for ``pgrouter verify``: every record from the first offset to the
end offsets when the read starts, decoded whatever the format, folded (``router.verify.fold``).

Rules:

* Records are decoded by ``Decoder``: pgrouter's JSON and Kafka Connect's JSON by their shape,
  Avro (first byte ``0x00``) with the schemas of ``[kafka.registry]``; the same decoder reads
  the source side's records, so both sides are compared in one representation.
* pgrouter's JSON format, the one read fastest, is taken apart by a typed decoder
  (``Decoder.feeder``: the operation, ``before``, ``after`` and the position, the rest of the
  envelope skipped unread) into ``TopicFold.apply``; a record of another shape goes the
  general way (``Decoder.key``, ``Decoder.value``, ``TopicFold.add``), which folds alike.
* A record that cannot be read (its key or value not what pgrouter writes: a foreign
  producer, a damaged topic — a value that is not JSON, Connect or Avro, a JSON value that
  is not UTF-8 (also in members the typed decoder skips unread), a JSON value that is
  neither a change record, a logical message nor transaction metadata, an Avro record
  without ``[kafka.registry]``) is a ``SinkError`` naming the topic and the record's key:
  a consumer would read something verify cannot compare. Logical messages (``op: "m"``)
  and transaction metadata are skipped; a tombstone goes to ``TopicFold.tombstone``.
* A topic that does not exist is a ``SinkError`` naming it; a Kafka that cannot be reached,
  or that answers for the topic with a transient error until the deadline (no leader yet),
  is ``SinkUnavailable`` naming it (``actors.verify.presence``): never "does not exist".
  A partition whose first offset is not 0 (retention or ``kafka-delete-records`` removed
  its oldest records) is read from its first offset, as a consumer reading from the start
  reads it: the rows it lacks are compared as missing (``fold.starts`` says where each
  such partition starts).
* ``wal_end()`` (blocking), called once the end offsets are taken, is the source's WAL end:
  every record the router wrote before them has a commit LSN at or below it
  (``TopicFold.end``).
* The cyclic garbage collector is off while a topic is read: the fold makes millions of
  tuples and no cycle, and each of its passes would walk every key held.
* Blocking: run in a worker thread. ``progress(n)`` is called after each batch read (the
  caller prints a line at its own pace).
"""

from __future__ import annotations

import gc
import time

import msgspec

from router.errors import PgRouterError, SinkError, SinkUnavailable
from router.verify.fold import TopicFold, envelope_of, key_of, key_payload, utf8_checked
from router.native import NATIVE
from router.verify.digests import fold_batch_py, layout_of, row_digests_py

from router.config.kafka_settings import KAFKA_PYTHON, LIBRDKAFKA

from ..kafka.admin import connection_conf
from ..kafka.compacted import kafka_python_conf
from ..kafka.registry import decoder_for
from ..kafka.versions import known_api_version
from ..services.preflight import probe_kafka
from .presence import READY, await_topic, kafka_python_state, rdkafka_marks

#: messages a consume() call returns at most, folded by one call of the C fold, which holds
#: the GIL throughout: the event loop's thread, reading the COPY for the digests meanwhile,
#: waits for it and still finishes before the fold. Slices of 1,000 records let the COPY
#: finish sooner but made the fold, the longer of the two, slower (comparison 2.59 s
#: against 2.13 s, CPU 1.72 s against 1.56 s: medians of 5 interleaved rounds of
#: bench/verify.py at 200,000 rows, load 6-10)
BATCH = 10_000
#: librdkafka stops fetching while its queue holds ``queued.min.messages`` (100,000) and, by
#: default, looks again only a second later (``fetch.queue.backoff.ms``, 1000 since 2.4):
#: the fold is slower than the fetches, so every 100,000 records it waited for most of that
#: second with an empty queue (measured at 200,000 rows: 1.0 s of 1.9 s in ``consume``)
FETCH_BACKOFF_MS = 10
TIMEOUT = 60.0


class _Source(msgspec.Struct):
    commit_lsn: int | None = None
    seq: int | None = None


class _Change(msgspec.Struct):
    """What the fold takes of a JSON-format change record (other fields are skipped)."""

    op: str = ""
    before: dict | None = None
    after: dict | None = None
    source: _Source | None = None
    unchanged_toast: list | None = None


class _RawChange(msgspec.Struct):
    """``_Change`` with ``before`` and ``after`` left as their JSON (the C fold takes
    ``after`` apart itself, ``router._native.verify_fold``)."""

    op: str = ""
    before: msgspec.Raw = msgspec.Raw(b"null")
    after: msgspec.Raw = msgspec.Raw(b"null")
    source: _Source | None = None
    unchanged_toast: list | None = None


_OPS = frozenset({"c", "r", "u", "d", "t"})


class Decoder:
    """``(key bytes, value bytes) -> (key, envelope)`` for every format the router writes."""

    def __init__(self, registry_cfg):
        self.avro = decoder_for(registry_cfg)
        self._json = msgspec.json.Decoder()
        self._change = msgspec.json.Decoder(_Change)
        self._raw = msgspec.json.Decoder(_RawChange)

    def feeder(self, fold: TopicFold, keyless: bool):
        """``(key bytes, value bytes) -> None`` into ``fold``: pgrouter's JSON format taken
        apart by a typed decoder (the fields the fold needs, the rest skipped unread); any
        other record (Kafka Connect, Avro, not a change) through ``key`` and ``value``."""
        change, apply, add = self._change.decode, fold.apply, fold.add
        key = (lambda _: None) if keyless else self.key
        value, plain = self.value, self._json.decode

        def feed(kb: bytes | None, vb: bytes | None) -> None:
            try:
                fold_one(kb, vb)
            except PgRouterError:
                raise
            except Exception as exc:  # noqa: BLE001 — whatever a foreign record breaks
                raise BadRecord(kb, exc) from exc

        def fold_one(kb: bytes | None, vb: bytes | None) -> None:
            if vb is None:
                if kb is not None and not keyless:
                    fold.tombstone(key(kb))
                return
            try:
                c = change(vb)
            except msgspec.DecodeError:  # not this shape: the general way
                add(key(kb), value(vb))
                return
            utf8_checked(vb)  # what the typed decoder skipped unread a consumer's parser reads
            op = c.op
            if op not in _OPS:
                if op != "m":  # a Connect record, transaction metadata… or a foreign one
                    add(key(kb), value(vb))
                return
            src = c.source
            pos = 0 if src is None else ((src.commit_lsn or 0) << 64) | (src.seq or 0)
            after, toast = c.after, c.unchanged_toast
            if toast and after:
                after = {k: v for k, v in after.items() if k not in toast}
            # the JSON format's key: a plain object (None: a keyless table's or a truncate's)
            apply(None if keyless or kb is None else plain(kb), op, pos, c.before, after,
                  toast)

        return feed

    def batcher(self, fold: TopicFold, keyless: bool):
        """``(messages, ends) -> messages read`` into ``fold``: confluent-kafka's messages
        before their partition's end offset in ``ends``; with bucket digests, the plain
        records folded in one call of the C accelerator (``router._native.verify_fold``,
        its twin ``router.verify.digests.fold_batch_py``), the others through ``feeder``."""
        feed = self.feeder(fold, keyless)
        buckets = getattr(fold.digester, "buckets", None)
        if buckets is not None and not keyless and fold.part is None:
            fast = getattr(NATIVE, "verify_fold", None) or fold_batch_py
            tools = (self._raw.decode, self._json.decode, key_of, layout_of, feed,
                     row_digests_py)
            rows, cut = fold.rows, fold.cut

            def batch(msgs: list, ends: dict) -> int:
                read, after_cut, folded = fast(msgs, ends, rows, cut, buckets, tools)
                fold.after_cut += after_cut
                fold.records += folded
                return read

            return batch

        def each(msgs: list, ends: dict) -> int:
            n = 0
            for m in msgs:
                if m.error() is None:
                    end = ends.get(m.partition())
                    if end is not None and m.offset() < end:
                        feed(m.key(), m.value())
                        n += 1
            return n

        return each

    def key(self, data: bytes | None):
        if data is None:
            return None
        if data[:1] == b"\x00":
            return self._avro().key(data)
        return key_payload(self._json.decode(data))

    def value(self, data: bytes | None) -> dict | None:
        """The envelope of a change record; None for a tombstone, a logical message or
        transaction metadata; ``ValueError`` (``msgspec.DecodeError`` among them) for anything
        else."""
        if data is None:
            return None
        if data[:1] == b"\x00":
            return envelope_of(self._avro().envelope(data))
        doc = self._json.decode(data)
        env = envelope_of(doc)
        if env is None and not _skipped(doc):
            raise ValueError("a JSON value that is not a change record, a logical message "
                             "or transaction metadata")
        return env

    def _avro(self):
        if self.avro is None:  # a foreign record (a JSON route), or a config without one
            raise ValueError("an Avro record (its first byte 0) and no [kafka.registry] in "
                             "the config to read it")
        return self.avro


def _skipped(doc) -> bool:
    """A JSON value pgrouter writes that is no row change: a logical message, transaction
    metadata (also in a Connect record's ``payload``)."""
    if isinstance(doc, dict) and "payload" in doc and "schema" in doc:
        doc = doc["payload"]
    return isinstance(doc, dict) and (doc.get("op") == "m" or (
        doc.get("status") in ("BEGIN", "END") and "id" in doc))


def fold_topic(bootstrap_servers, settings: dict, topic: str, fold: TopicFold,
               decoder: Decoder, progress=None, keyless: bool = False,
               timeout: float = TIMEOUT, library: str = KAFKA_PYTHON, wal_end=None) -> int:
    """Every record of ``topic`` up to its end offsets now into ``fold`` (``keyless``: as a
    multiset of rows, whatever the keys), read with ``library`` (``[kafka] client``:
    librdkafka reads about ten times faster); returns the count. ``wal_end()``: the
    source's WAL end, asked once the end offsets are taken (``TopicFold.end``)."""
    read = _fold_rdkafka if library == LIBRDKAFKA else _fold
    collecting = gc.isenabled()
    gc.disable()  # the fold makes containers by the million, none of them cyclic

    def marked(begins: dict) -> None:  # the end offsets are taken
        fold.starts = {p: b for p, b in begins.items() if b > 0}
        if wal_end is not None:
            fold.end = wal_end()

    try:
        return read(bootstrap_servers, settings, topic, fold, decoder, progress, keyless,
                    timeout, marked)
    except BadRecord as exc:
        raise SinkError(f"topic {topic!r} holds {exc}: it cannot be verified") from exc
    except PgRouterError:
        raise
    except Exception as exc:  # noqa: BLE001 — whatever the client raises: Kafka is not usable
        raise SinkUnavailable(f"kafka.bootstrap_servers: cannot read topic {topic!r} at "
                              f"{bootstrap_servers}: {type(exc).__name__}: {exc}") from exc
    finally:
        if collecting:
            gc.enable()


class BadRecord(SinkError):
    """A record verify cannot read (not written by pgrouter, or damaged); ``fold_topic``
    names its topic."""

    def __init__(self, key: bytes | None, exc: Exception):
        shown = key if key is None or len(key) <= 60 else key[:60] + b"..."
        super().__init__(f"a record that is not a change record verify can read (key "
                         f"{shown!r}): {type(exc).__name__}: {exc}")


def kafka_answers(bootstrap_servers, settings: dict, topics: list[str],
                  timeout: float) -> None:
    """Kafka answers a metadata request for ``topics`` (librdkafka; blocking), checked
    before the verify snapshot: ``SinkUnavailable`` in one line otherwise (the address
    refused first, ``probe_kafka``). A few milliseconds of CPU, where kafka-python's admin
    client takes a fifth of a second with its import."""
    from confluent_kafka import Consumer, KafkaException

    probe_kafka(bootstrap_servers)
    conf = connection_conf(bootstrap_servers, settings)
    conf.pop("request.timeout.ms", None)  # a producer's setting
    conf.update({"group.id": "pgrouter-verify", "allow.auto.create.topics": False})
    consumer = Consumer(conf)
    try:
        for topic in topics[:1] or [None]:
            consumer.list_topics(topic, timeout=timeout)
    except KafkaException as exc:
        raise SinkUnavailable(f"kafka.bootstrap_servers: Kafka not reachable at "
                              f"{bootstrap_servers}: {exc}") from exc
    finally:
        consumer.close()


def _described(bootstrap_servers, settings, topic: str, timeout: float):
    """``look`` for ``await_topic`` through kafka-python's admin client: the topic's own
    error code (the consumer's metadata drops a topic with an error, whatever it is)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers,
                             request_timeout_ms=int(min(timeout, 30) * 1000),
                             **kafka_python_conf(settings),
                             **known_api_version(bootstrap_servers))

    def look():
        found = [d for d in admin.describe_topics([topic]) if d.get("name") == topic]
        state, said = kafka_python_state(found[0] if found else None)
        return state, said, {p["partition_index"] for p in found[0]["partitions"]} if (
            state == READY) else None

    return admin, look


def _fold_rdkafka(bootstrap_servers, settings, topic, fold, decoder, progress, keyless,
                  timeout, marked) -> int:
    from confluent_kafka import Consumer, TopicPartition

    conf = connection_conf(bootstrap_servers, settings)
    conf.pop("request.timeout.ms", None)  # a producer's setting
    conf.update({"group.id": "pgrouter-verify", "enable.auto.commit": False,
                 "allow.auto.create.topics": False, "isolation.level": "read_committed",
                 "enable.partition.eof": False, "fetch.queue.backoff.ms": FETCH_BACKOFF_MS})
    consumer = Consumer(conf)
    try:
        marks = await_topic(lambda: rdkafka_marks(consumer, topic, timeout), topic,
                            bootstrap_servers, timeout)
        ends = {p: end for p, (_b, end) in marks.items()}
        left = {p for p, (begin, end) in marks.items() if end > begin}
        consumer.assign([TopicPartition(topic, p, marks[p][0]) for p in left])
        # librdkafka fetches meanwhile (the WAL end is a connection of its own away)
        marked({p: begin for p, (begin, _end) in marks.items()})
        batch = decoder.batcher(fold, keyless)
        n = shown = 0
        deadline = time.monotonic() + timeout
        while left:
            msgs = consumer.consume(BATCH, 0.2)
            if msgs:
                deadline = time.monotonic() + timeout
            elif time.monotonic() > deadline:
                raise SinkUnavailable(f"timed out reading topic {topic!r}: no records for "
                                      f"{timeout:g} s before its end")
            n += batch(msgs, ends)
            if progress is not None and n > shown:
                shown = n
                progress(n)
            for tp in consumer.position([TopicPartition(topic, p) for p in left]):
                if tp.offset >= ends[tp.partition]:
                    left.discard(tp.partition)
        return n
    finally:
        consumer.close()


def _fold(bootstrap_servers, settings, topic, fold, decoder, progress, keyless,
          timeout, marked) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=None,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             allow_auto_create_topics=False,
                             isolation_level="read_committed",
                             request_timeout_ms=int(min(timeout, 30) * 1000),
                             **kafka_python_conf(settings),
                             **known_api_version(bootstrap_servers))
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            consumer.topics()  # fresh metadata: a topic made a moment ago
            parts = consumer.partitions_for_topic(topic)
        if not parts:  # missing, or an error the consumer's metadata does not keep
            admin, look = _described(bootstrap_servers, settings, topic, timeout)
            try:
                parts = await_topic(look, topic, bootstrap_servers, timeout)
            finally:
                admin.close()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        begins, ends = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
        marked({tp.partition: begins[tp] for tp in tps})
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        n = 0
        deadline = time.monotonic() + timeout
        feed = decoder.feeder(fold, keyless)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            batch = consumer.poll(timeout_ms=500, max_records=5000)
            if batch:
                deadline = time.monotonic() + timeout
            elif time.monotonic() > deadline:
                raise SinkUnavailable(f"timed out reading topic {topic!r}: no records for "
                                      f"{timeout:g} s before its end")
            for tp, msgs in batch.items():
                end = ends[tp]
                for m in msgs:
                    if m.offset < end:
                        feed(m.key, m.value)
                        n += 1
            if progress is not None and batch:
                progress(n)
        return n
    finally:
        consumer.close()
