"""Reassembling source transactions from Kafka: data records of many topics plus the
router's transaction topic (``router.transaction_meta``), released whole, in commit order.

Rules:

* The transaction topic has one partition, so its END records arrive in source commit
  order; they fix the order transactions are released in. An END whose ``commit_lsn`` is
  not above the last one queued is a duplicate (the router re-sends after a restart) and is
  ignored, as is everything at or below ``applied_lsn`` (already applied on the target).
* A transaction is complete when, for every wanted topic its END names, as many distinct
  records have arrived as END counts. Records are told apart by position
  ``(topic, route, seq, schema, table)`` within the transaction, so byte-identical
  duplicates count once. Topics the applier does not want are not waited for.
* Only the head of the queue is released: a later transaction never overtakes an earlier
  one, even when its records arrived first.
* Records whose transaction has no END yet are buffered by ``commit_lsn``.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterator

import msgspec

from .errors import DecodeError


class RecordSource(msgspec.Struct):
    commit_lsn: int | None = None
    seq: int = 0
    schema: str | None = None
    table: str | None = None
    route: str = ""
    xid: int | None = None
    commit_time: str | None = None


class DataRecord(msgspec.Struct):
    """The fields of a pgrouter envelope (``router.envelope``) the applier needs."""

    op: str
    source: RecordSource
    before: dict | None = None
    after: dict | None = None
    unchanged_toast: list[str] = []
    truncate: dict | None = None


class DataCollection(msgspec.Struct):
    data_collection: str
    event_count: int


class MetaSource(msgspec.Struct):
    commit_lsn: int
    xid: int
    commit_time: str
    end_lsn: int = 0
    origin: str | None = None


class TransactionRecord(msgspec.Struct):
    status: str
    id: str
    source: MetaSource
    event_count: int | None = None
    data_collections: list[DataCollection] | None = None


_decode_data = msgspec.json.Decoder(DataRecord).decode
_decode_meta = msgspec.json.Decoder(TransactionRecord).decode


class SourceTransaction(msgspec.Struct):
    id: str
    xid: int
    commit_lsn: int
    commit_time: str
    origin: str | None
    #: (topic, record) in the transaction's change order (seq)
    records: list[tuple[str, DataRecord]]


class _Pending:
    __slots__ = ("meta", "expected", "offset")

    def __init__(self, meta: TransactionRecord, expected: dict[str, int], offset: int):
        self.meta = meta
        self.expected = expected
        self.offset = offset


class Reassembler:
    def __init__(self, wants: Callable[[str], bool], applied_lsn: int = 0):
        self.wants = wants
        self.applied_lsn = applied_lsn
        self._queue: deque[_Pending] = deque()
        self._last_queued = applied_lsn
        self._buffers: dict[int, dict[tuple, tuple[str, DataRecord]]] = {}
        self._counts: dict[int, dict[str, int]] = {}
        self._topics: set[str] = set()
        self.duplicates = 0

    @property
    def pending(self) -> int:
        return len(self._queue)

    def oldest_pending_offset(self) -> int | None:
        """Transaction-topic offset of the earliest END not yet released."""
        return self._queue[0].offset if self._queue else None

    def add_transaction_record(self, value: bytes, offset: int = 0) -> list[str]:
        """Feed one transaction-topic record; returns wanted topics it names for the first
        time (the caller starts reading them)."""
        try:
            meta = _decode_meta(value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise DecodeError(f"not a pgrouter transaction record: {exc}") from exc
        if meta.status != "END":
            return []
        lsn = meta.source.commit_lsn
        if lsn <= self._last_queued:
            self.duplicates += 1
            return []
        self._last_queued = lsn
        expected = {dc.data_collection: dc.event_count for dc in meta.data_collections or ()
                    if self.wants(dc.data_collection)}
        self._queue.append(_Pending(meta, expected, offset))
        new = [t for t in expected if t not in self._topics]
        self._topics.update(new)
        return new

    def add_record(self, topic: str, value: bytes) -> None:
        if value is None:  # a tombstone: pgrouter writes none, nothing to apply
            return
        try:
            rec = _decode_data(value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise DecodeError(f"not a pgrouter record on {topic}: {exc}") from exc
        src = rec.source
        lsn = src.commit_lsn
        if lsn is None or lsn <= self.applied_lsn:
            return  # non-transactional message, or applied already
        pos = (topic, src.route, src.seq, src.schema, src.table)
        buf = self._buffers.get(lsn)
        if buf is None:
            buf = self._buffers[lsn] = {}
            self._counts[lsn] = {}
        if pos in buf:
            self.duplicates += 1
            return
        buf[pos] = (topic, rec)
        counts = self._counts[lsn]
        counts[topic] = counts.get(topic, 0) + 1

    def _complete(self, p: _Pending) -> bool:
        counts = self._counts.get(p.meta.source.commit_lsn, {})
        return all(counts.get(t, 0) >= n for t, n in p.expected.items())

    def ready(self) -> Iterator[SourceTransaction]:
        """Complete transactions at the head of the queue, in commit order. A released
        transaction counts as applied (when applying fails, the applier starts over with a
        new reassembler from the target's origin progress)."""
        q = self._queue
        while q and self._complete(q[0]):
            p = q.popleft()
            meta = p.meta
            lsn = meta.source.commit_lsn
            buf = self._buffers.pop(lsn, {})
            self._counts.pop(lsn, None)
            self.applied_lsn = lsn
            wanted = [v for v in buf.values() if v[0] in p.expected]
            wanted.sort(key=lambda tr: tr[1].source.seq)
            yield SourceTransaction(id=meta.id, xid=meta.source.xid, commit_lsn=lsn,
                                    commit_time=meta.source.commit_time,
                                    origin=meta.source.origin, records=wanted)
            # buffers of transactions that were superseded cannot complete any more
            for stale in [k for k in self._buffers if k <= lsn]:
                del self._buffers[stale]
                self._counts.pop(stale, None)
