"""The chunks of a backfill in the stream: the window between a chunk's low and high
watermarks, and the chunk's rows that come out of it (DBLog).

Rules:

* A watermark is a transaction of one ``pgrouter.snapshot`` logical message for this slot
  (``watermark_of``); anything else passes as a change.
* Between the two watermarks of a chunk the stream's changes of the tables backfilled are
  recorded (``observe``: every key the stream changes; a TRUNCATE too); at the high
  watermark the chunk rows whose key was not changed go out as ``op: "r"`` records of the
  job's route only, right after the high watermark's transaction and at its position
  (``router.snapshot.core``). Changes flow as usual all along.
* Transactions the chunk's read saw in progress that committed before the low watermark
  count as inside the window (``router.snapshot.core.RecentChanges``).
* A repair's keys the table does not hold, unchanged in the window, go out as deletes
  after the chunk's rows.
"""

from __future__ import annotations

import trio

from router.formats.envelope import TxContext
from router.snapshot.core import PREFIX, ChunkWindow, RecentChanges, Watermark, decode_watermark
from router.stream.transactions import Transaction

from .jobs import Job


class Chunk:
    __slots__ = ("job", "rows", "window", "emitted", "end_lsn", "spoiled", "low", "xip",
                 "absent")

    def __init__(self, job: Job):
        self.job = job
        self.rows: list | None = None
        self.low = 0  # the number of the last recent change before the low watermark
        self.xip: frozenset[int] = frozenset()  # in progress for the chunk's read
        self.window: ChunkWindow | None = None
        self.emitted = trio.Event()
        self.end_lsn = 0
        self.spoiled = False
        self.absent: list[tuple] = []  # a repair's keys the table does not hold


def watermark_of(txn: Transaction, slot: str) -> Watermark | None:
    for change in txn.changes:
        if change.op != "message" or change.message.prefix != PREFIX:
            return None
        mark = decode_watermark(change.message.prefix, change.message.content)
        return mark if mark is not None and mark.slot == slot else None
    return None


def observe(txn: Transaction, watch: dict, recent: RecentChanges, opened: list[Chunk]
            ) -> None:
    """A transaction while tables are backfilled: its changes of those tables are
    remembered (``RecentChanges``) and go to the open windows."""
    xid = txn.xid
    for change in txn.changes:
        rel = change.relation
        if change.op == "truncate" or (rel is not None and
                                       (rel.namespace, rel.name) in watch):
            recent.add(xid, change)
            for c in opened:
                c.window.observe(change.op, rel, change.old, change.new, change.relations)


def open_window(chunk: Chunk, recent: RecentChanges) -> None:
    """The chunk's low watermark: its window opens."""
    job = chunk.job
    rel = job.table.relation
    chunk.window = ChunkWindow((rel.namespace, rel.name), job.key, job.row_key,
                               tuple(c.name for c in rel.columns))
    chunk.low = recent.count


def close_window(chunk: Chunk, txn: Transaction, recent: RecentChanges):
    """The chunk's high watermark (``txn``): its rows not changed in the window, as the
    job's route's records at the watermark's position."""
    job = chunk.job
    # committed before the low watermark but not yet visible to the chunk's read
    recent.replay(chunk.window, chunk.low, chunk.xip)
    kept = chunk.window.keep(chunk.rows or [])
    chunk.spoiled = chunk.window.spoiled
    tx = TxContext(xid=txn.xid, commit_lsn=txn.commit_lsn, end_lsn=txn.end_lsn,
                   commit_time=txn.commit_time)
    routed = job.encoder.chunk(job.table.relation, kept, tx, txn.change_count,
                               repair=bool(job.keys))
    if chunk.absent:  # a repair's keys the table does not hold, unchanged in the window
        gone = [k for k in chunk.absent if k not in chunk.window.changed]
        routed.records.extend(job.encoder.deletes(
            job.table.relation, gone, job.row_key, tx,
            txn.change_count + len(chunk.rows or ())).records)
    chunk.end_lsn = txn.end_lsn
    chunk.emitted.set()
    return routed
