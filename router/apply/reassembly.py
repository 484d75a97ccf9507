"""Reassembling source transactions from Kafka: data records of many topics plus the
router's transaction topic (``router.routing.transaction_meta``), released whole, in commit order.

Rules:

* The transaction topic has one partition, so its END records arrive in source commit
  order; they fix the order transactions are released in. An END whose ``commit_lsn`` is
  not above the last one queued is a duplicate (the router re-sends after a restart) and is
  ignored; an END at or below ``applied_lsn`` (the target's replication origin progress at
  start) is counted in ``skipped``: a restart skipped it.
* A transaction is complete when, for every wanted topic its END names, as many distinct
  records have arrived as END counts. The router writes a transaction's records of one
  partition in change order (``seq``), and a re-sent transaction repeats them in the same
  order, so within one (partition, route) a record whose ``seq`` is not above the last one
  kept is a duplicate. Topics the applier does not want are not waited for.
* Only the head of the queue is released: a later transaction never overtakes an earlier
  one, even when its records arrived first. Released records are merged across partitions
  by ``seq``, the source's change order.
* Memory: records waiting for their END are counted in bytes (encoded size plus what the
  decoded record holds, ``RECORD_OVERHEAD``); past
  ``memory_limit`` the largest transactions' records move to temporary files (in
  ``spill_dir``), one per partition, and are read back one at a time while applied.
* Snapshot and backfill rows (``op: "r"``) belong to no transaction the END records count:
  they are kept apart, by position, and released as snapshot batches
  (``SourceTransaction.snapshot``) at their place in commit order: rows at ``commit_lsn L``
  after every transaction committed at or before ``L`` and before any later one. A row at
  ``L`` waits until that order is known: an END above ``L`` is queued, or (no END pending)
  one at or above ``L`` was read; an initial snapshot's rows (``xid`` 0, at the slot's
  consistent point - 1, before every transaction it streams) wait only for the
  transactions queued before them. Rows at the target's progress are kept (a backfill
  chunk sits at its high watermark's position, which may be applied already).
* Restart positions: the last transaction of every ``ready()`` round (the calls until no
  complete transaction is left) carries ``resume``,
  the offset per ``topic/partition`` from which a reader that has applied everything up to
  and including it finds every record of every later transaction (the earliest record still
  buffered, else the next offset to read). Stored with the applied transaction on the target,
  it lets a restart seek there instead of re-reading the topics.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Callable, Iterator

import msgspec

from ..errors import DecodeError
from .buffers import RECORD_OVERHEAD, Records, _Buffer, _Part
from .records import DataRecord, TransactionRecord, _decode_data, _decode_meta

DEFAULT_MEMORY_LIMIT = 64 * 1024 * 1024
class SourceTransaction(msgspec.Struct, gc=False):
    id: str
    xid: int
    commit_lsn: int
    commit_time: str
    origin: str | None
    #: (topic, record) in the transaction's change order (seq)
    records: Records
    #: number of records
    count: int = 0
    #: "topic/partition" -> offset to restart reading from once this one is applied
    resume: dict[str, int] | None = None
    #: source (schema, table) of the records
    tables: frozenset = frozenset()
    #: snapshot or backfill rows (``op: "r"``) at ``commit_lsn``, not a source transaction
    snapshot: bool = False


class _Pending:
    __slots__ = ("meta", "expected", "offset")

    def __init__(self, meta: TransactionRecord, expected: dict[str, int], offset: int):
        self.meta = meta
        self.expected = expected
        self.offset = offset


class Reassembler:
    def __init__(self, wants: Callable[[str], bool], applied_lsn: int = 0, *,
                 transactions_topic: str = "", memory_limit: int = DEFAULT_MEMORY_LIMIT,
                 spill_dir: str | None = None, positions: dict[str, int] | None = None):
        """``positions``: the restart offsets reading starts from (``resume`` of the last
        transaction applied), kept for partitions this reassembler has no record of."""
        self.wants = wants
        self.applied_lsn = applied_lsn
        self.transactions_topic = transactions_topic
        self.memory_limit = memory_limit
        self.spill_dir = spill_dir
        self._start_lsn = applied_lsn
        self._queue: deque[_Pending] = deque()
        self._last_queued = applied_lsn
        self._buffers: dict[int, _Buffer] = {}
        self._lsns: list[int] = []  # heap of the buffers' commit LSNs
        self._topics: set[str] = set()
        self._next: dict[tuple[str, int], int] = {}  # next offset to read, per partition
        for key, offset in (positions or {}).items():
            topic, _, part = key.rpartition("/")
            self._next[(topic, int(part))] = offset
        self._snapshots: dict[int, _Buffer] = {}  # snapshot rows by commit_lsn
        self._initial: set[int] = set()  # commit_lsns of initial-snapshot rows
        self._memory = 0
        self.peak_memory = 0
        self.duplicates = 0
        self.skipped = 0  # transactions at or below the target's progress at start
        self._skipped_lsn = 0
        self.spills = 0

    @property
    def pending(self) -> int:
        return len(self._queue)

    @property
    def memory(self) -> int:
        return self._memory

    def oldest_pending_offset(self) -> int | None:
        """Transaction-topic offset of the earliest END not yet released."""
        return self._queue[0].offset if self._queue else None

    def add_transaction_record(self, value: bytes | None, offset: int = 0) -> list[str]:
        """Feed one transaction-topic record; returns wanted topics it names for the first
        time (the caller starts reading them)."""
        self._next[(self.transactions_topic, 0)] = offset + 1
        if value is None or value.startswith(b'{"status":"BEGIN"'):  # how the router writes them: nothing to do
            return []
        try:
            meta = _decode_meta(value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise DecodeError(f"not a pgrouter transaction record: {exc}") from exc
        if meta.status != "END":
            return []
        lsn = meta.source.commit_lsn
        if lsn <= self._last_queued:
            if self._skipped_lsn < lsn <= self._start_lsn:
                self.skipped += 1
                self._skipped_lsn = lsn
            else:
                self.duplicates += 1
            return []
        self._last_queued = lsn
        expected = {dc.data_collection: dc.event_count for dc in meta.data_collections or ()
                    if self.wants(dc.data_collection)}
        self._queue.append(_Pending(meta, expected, offset))
        new = [t for t in expected if t not in self._topics]
        self._topics.update(new)
        return new

    def add_record(self, topic: str, value: bytes | None, partition: int = 0,
                   offset: int = 0) -> None:
        self.add_records(topic, partition, [(offset, value)])

    def add_records(self, topic: str, partition: int,
                    records: list[tuple[int, bytes | None]]) -> None:
        """Feed consecutive records ``(offset, value)`` of one data partition."""
        if not records:
            return
        tp = (topic, partition)
        self._next[tp] = records[-1][0] + 1
        applied = self.applied_lsn
        last_lsn = part = buf = last_table = last_schema = None
        added = 0
        for offset, value in records:
            if value is None:  # a tombstone: pgrouter writes none, nothing to apply
                continue
            try:
                rec = _decode_data(value)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise DecodeError(f"not a pgrouter record on {topic}: {exc}") from exc
            src = rec.source
            lsn = src.commit_lsn
            if lsn is None or lsn <= applied:
                if rec.op != "r" or lsn is None or lsn < applied:
                    continue  # non-transactional message, or applied already
            if rec.op == "r":
                if added and buf is not None:
                    self._account(buf, added)
                added = 0
                last_lsn = part = buf = None
                self._add_snapshot_row(tp, offset, rec, len(value))
                continue
            if lsn != last_lsn:
                last_table = last_schema = None
                if added and buf is not None:
                    self._account(buf, added)
                    added = 0
                last_lsn = lsn
                buf = self._buffers.get(lsn)
                if buf is None:
                    buf = self._buffers[lsn] = _Buffer()
                    heapq.heappush(self._lsns, lsn)
                part = buf.parts.get(tp)
                if part is None:
                    part = buf.parts[tp] = _Part(topic)
                    buf.first_offsets[tp] = offset
            seq = src.seq
            if seq <= part.last_seq:
                if src.route == "" or self._seen(part, rec):
                    self.duplicates += 1
                    continue
                part.ordered = False  # two routes writing one topic: seqs interleave
            else:
                part.last_seq = seq
            part.count += 1
            if src.table != last_table or src.schema != last_schema:
                last_table, last_schema = src.table, src.schema
                if rec.op != "m":
                    part.tables.add((last_schema, last_table))
            if part.file is not None:
                part.append(value)
                continue
            part.records.append(rec)
            added += len(value) + RECORD_OVERHEAD
        if added and buf is not None:
            self._account(buf, added)

    def _add_snapshot_row(self, tp: tuple[str, int], offset: int, rec: DataRecord,
                          size: int) -> None:
        lsn = rec.source.commit_lsn
        buf = self._snapshots.get(lsn)
        if buf is None:
            buf = self._snapshots[lsn] = _Buffer()
        if rec.source.xid == 0:
            self._initial.add(lsn)
        part = buf.parts.get(tp)
        if part is None:
            part = buf.parts[tp] = _Part(tp[0])
            buf.first_offsets[tp] = offset
        part.count += 1
        part.tables.add((rec.source.schema, rec.source.table))
        part.records.append(rec)  # never spilled: released as soon as their place is known
        buf.memory += size + RECORD_OVERHEAD
        self._memory += size + RECORD_OVERHEAD
        self.peak_memory = max(self.peak_memory, self._memory)

    def _snapshot_batches(self, below: int | None) -> list[SourceTransaction]:
        """Snapshot rows whose place is before the transaction at ``below`` (None: no END
        pending), oldest first."""
        out = []
        for lsn in sorted(self._snapshots):
            if below is not None and lsn >= below:
                break
            if below is None and lsn > self._last_queued and lsn not in self._initial:
                break  # an END at or below it may still come
            buf = self._snapshots.pop(lsn)
            self._initial.discard(lsn)
            self._memory -= buf.memory
            parts = list(buf.parts.values())
            out.append(SourceTransaction(
                id=f"snapshot:{lsn}", xid=0, commit_lsn=lsn, commit_time="", origin=None,
                records=Records(parts), count=sum(p.count for p in parts),
                tables=frozenset().union(*(p.tables for p in parts)), snapshot=True))
        return out

    def _account(self, buf: _Buffer, size: int) -> None:
        buf.memory += size
        self._memory += size
        if self._memory > self.peak_memory:
            self.peak_memory = self._memory
        if self._memory > self.memory_limit:
            self._spill()

    @staticmethod
    def _seen(part: _Part, rec: DataRecord) -> bool:
        """Whether an out-of-order record repeats one kept (same route and seq)."""
        src = rec.source
        if part.file is not None:
            part.file.flush()
            part.file.seek(0)
            try:
                return any(r.source.seq == src.seq and r.source.route == src.route
                           for r in _Part._read(part.file))
            finally:
                part.file.seek(0, 2)
        return any(r.source.seq == src.seq and r.source.route == src.route
                   for r in part.records)

    def _spill(self) -> None:
        for buf in sorted(self._buffers.values(), key=lambda b: b.memory, reverse=True):
            if self._memory <= self.memory_limit // 2 or not buf.memory:
                break
            for part in buf.parts.values():
                if part.file is None:
                    part.spill(self.spill_dir)
            self._memory -= buf.memory
            buf.memory = 0
            self.spills += 1

    def _complete(self, p: _Pending) -> bool:
        buf = self._buffers.get(p.meta.source.commit_lsn)
        expected = p.expected
        if buf is not None and len(buf.parts) == 1 and len(expected) == 1:
            # the common case, one partition of one topic: no counting by topic
            (topic, _), part = next(iter(buf.parts.items()))
            return part.count >= expected.get(topic, 1 << 62)
        counts: dict[str, int] = {}
        if buf is not None:
            for (topic, _), part in buf.parts.items():
                counts[topic] = counts.get(topic, 0) + part.count
        return all(counts.get(t, 0) >= n for t, n in expected.items())

    def resume_offsets(self) -> dict[str, int]:
        """Per partition, where a restart that has applied every released transaction
        starts reading: the earliest record still buffered, or the next one to read."""
        out = dict(self._next)
        for buf in (*self._buffers.values(), *self._snapshots.values()):
            for tp, off in buf.first_offsets.items():
                if off < out.get(tp, off + 1):
                    out[tp] = off
        if self._queue:
            out[(self.transactions_topic, 0)] = self._queue[0].offset
        return {f"{t}/{p}": o for (t, p), o in out.items()}

    def ready(self, limit: int | None = None) -> Iterator[SourceTransaction]:
        """Complete transactions at the head of the queue, in commit order, at most about
        ``limit`` (the rest at the next call). A released transaction counts as applied
        (when applying fails, the applier starts over with a new reassembler from the
        target's progress). The last one released when no complete one is left carries
        ``resume`` (computed once a round: it looks at every buffered transaction)."""
        q = self._queue
        out: list[SourceTransaction] = []
        while True:
            if self._snapshots:
                out += self._snapshot_batches(q[0].meta.source.commit_lsn if q else None)
            if not (q and self._complete(q[0])):
                break
            if limit is not None and len(out) >= limit:
                return iter(out)  # the next call goes on
            p = q.popleft()
            meta = p.meta
            lsn = meta.source.commit_lsn
            buf = self._buffers.pop(lsn, None) or _Buffer()
            self._memory -= buf.memory
            self.applied_lsn = lsn
            parts = [part for (topic, _), part in buf.parts.items() if topic in p.expected]
            if len(parts) != len(buf.parts):
                for (topic, _), part in buf.parts.items():
                    if topic not in p.expected:
                        part.close()
            if len(parts) == 1:  # the common case: no sums nor unions over one partition
                count, tables = parts[0].count, frozenset(parts[0].tables)
            else:
                count = sum(part.count for part in parts)
                tables = frozenset().union(*(part.tables for part in parts))
            out.append(SourceTransaction(
                id=meta.id, xid=meta.source.xid, commit_lsn=lsn,
                commit_time=meta.source.commit_time, origin=meta.source.origin,
                records=Records(parts), count=count, tables=tables))
            # buffers of transactions that were superseded cannot complete any more
            heap = self._lsns
            while heap and heap[0] <= lsn:
                old = self._buffers.pop(heapq.heappop(heap), None)
                if old is not None:
                    self._memory -= old.memory
                    for part in old.parts.values():
                        part.close()
        if out:
            out[-1].resume = self.resume_offsets()
        return iter(out)

    def close(self) -> None:
        for buf in (*self._buffers.values(), *self._snapshots.values()):
            for part in buf.parts.values():
                part.close()
        self._buffers.clear()
        self._snapshots.clear()
