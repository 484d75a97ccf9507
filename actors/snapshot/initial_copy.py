"""The initial copy: every routed table read on the slot's exported snapshot
(``actors.services.slots.ExportedSlot``) into the pipeline's sink, until Kafka holds every record.

Rules:

* Readers (``[snapshot] parallel`` sessions) import the snapshot (REPEATABLE READ) and take
  (table, block range) entries from a shared queue: the ranges of one table follow each
  other, so every session reads a big table when it comes. A table is split in block
  ranges only from PostgreSQL 14 (TID range scans) and with more than one session.
* Rows go through the same route semantics as changes (``router.snapshot.rows``), with
  positions before the consistent point (``router.snapshot.core.initial_position``); a range
  with more rows than its positions can number fails with one line.
* The copy reads the sink's tickets itself (``tickets.AckedPrefix``): a range whose records
  Kafka holds is recorded done (when its table is split), and its table done per route
  once every range is — finishing an interrupted snapshot by backfill leaves those alone.
* A table is locked before it is read; one rewritten, truncated, dropped or renamed after
  the consistent point (``TableReader.rewritten``), or whose columns or partition parents
  changed since the catalog it was planned from (``ShapeCheck``), is not read: it is
  returned, to be copied by backfill once streaming.
* ``stop`` (a drain) stops the reading where it is; what was read is still delivered and
  acknowledged before the copy returns.
"""

from __future__ import annotations

import time
from logging import WARNING

import trio

from router.config.router import Config
from router.formats.envelope import TxContext
from router.errors import SourceError
from router.snapshot.core import RANGE_SHIFT, TABLE_SHIFT, SnapshotState, initial_position
from router.snapshot.ranges import block_ranges
from router.snapshot.rows import SnapshotRows

from ..pipeline.mailbox import Acked, Keepalive, Registered
from ..services import log
from ..services.slots import ExportedSlot
from .reader import ShapeCheck, TableReader, encode_chunk, session
from .report import Reporter
from .store import StateStore
from .tables import SnapshotTable
from .tickets import AckedPrefix

_log = log.get("snapshot")
_PG_EPOCH = 946684800


async def copy_tables(cfg: Config, out: trio.MemorySendChannel,
                      acks: trio.MemoryReceiveChannel, tables: list[SnapshotTable],
                      rows: SnapshotRows, slot: ExportedSlot, store: StateStore,
                      stop: trio.Event | None = None, shapes: dict | None = None
                      ) -> tuple[list[str] | None, list[str]]:
    """Every table of ``tables`` into ``out``, read in ``parallel`` sessions on the exported
    snapshot; returns once Kafka acknowledged every record (``acks``). A table whose records
    are all acknowledged is recorded done (per route) in the state topic: if the snapshot is
    interrupted, finishing it by backfill leaves that table alone. ``stop`` set stops the
    reading where it is (what was read is still delivered and acknowledged). Returns the
    tables not copied because they were rewritten after the snapshot (``rewritten``) or
    their columns changed since ``shapes`` were read (``ShapeCheck``), or None when
    ``stop`` left some unread; and the tables whose records Kafka holds, recorded done."""
    copy = _Copy(cfg, tables, rows, slot, store)
    await copy.plan(shapes)

    async def await_acks() -> None:
        await copy.await_acks(acks)

    try:
        cancelled = await _run(readers_of=copy.reader, sessions=copy.sessions, out=out,
                               cp=copy.cp, await_acks=await_acks, acked=copy.acked,
                               report=copy.report, stop=stop)
    finally:
        if copy.check is not None:
            await copy.check.close()
    copy.report.summary()
    done = sorted(name for name, n in copy.undone.items() if not n)
    if cancelled or any(n for name, n in copy.unread.items() if name not in copy.rewritten):
        return None, done
    return sorted(copy.rewritten), done


class _Copy:
    """One initial copy's shared state: the readers' queue, and which ranges are read,
    sent and durable."""

    def __init__(self, cfg: Config, tables: list[SnapshotTable], rows: SnapshotRows,
                 slot: ExportedSlot, store: StateStore):
        self.cfg, self.tables, self.rows, self.slot, self.store = cfg, tables, rows, slot, store
        cp = self.cp = slot.consistent_point
        self.tx = TxContext(xid=0, commit_lsn=initial_position(cp, 0, 0)[0], end_lsn=cp,
                            commit_time=int((time.time() - _PG_EPOCH) * 1_000_000))
        self.report = Reporter("initial snapshot", cfg.log.progress_interval)

    async def plan(self, shapes: dict | None) -> None:
        """The block ranges to read, queued."""
        cfg, tables, store = self.cfg, self.tables, self.store
        split, self.estimates, self.filenodes = await _block_ranges(cfg, tables)
        self.split = split
        started = store.get(SnapshotState("initial", self.slot.name, ""))
        self.snapshot = started.request if started is not None else ""
        # (table ordinal, table, range ordinal, blocks): the ranges of one table follow each
        # other, so every session reads the big table when it comes
        queue = [(o, t, i, b) for o, t in enumerate(tables) for i, b in enumerate(split[t.name])]
        self.sessions = max(1, min(cfg.snapshot.parallel, len(queue)))
        queue.reverse()
        self.queue = queue
        self.acked = AckedPrefix()
        self.pending: dict[tuple, int] = {}  # chunks sent and not known durable, per (table, range)
        self.read: set[tuple] = set()  # (table, range) read whole
        self.unread = {t.name: len(split[t.name]) for t in tables}  # ranges not read whole
        self.undone = dict(self.unread)  # ranges whose records are not all durable
        self.rewritten: set[str] = set()  # not readable on the snapshot: left to a backfill
        self.check = ShapeCheck(self.slot.dsn, shapes) if shapes is not None else None
        self.routes_of = {t.name: sorted({p.route for p in self.rows.router.plans_for(t.relation)})
                          for t in tables}

    async def durable(self, name: str, part: int) -> None:
        """All records of a range are in Kafka: recorded (when the table is split), and
        the table done once every range is."""
        cfg, split, store, undone = self.cfg, self.split, self.store, self.undone
        if len(split[name]) > 1:
            first, end = split[name][part]
            await store.aput(SnapshotState(
                "range", self.slot.name, "done", request=self.snapshot, table=name,
                blocks=(first, -1 if end is None else end),
                filenode=self.filenodes.get(name, 0)))
            log.event(_log, "initial snapshot: range done", table=name,
                      blocks=f"{first}-{'' if end is None else end}")
        undone[name] -= 1
        if undone[name]:
            return
        for route in self.routes_of[name]:
            await store.aput(SnapshotState("backfill", self.slot.name, "done", request="initial",
                                      route=route, table=name))

    async def reader(self, out: trio.MemorySendChannel) -> None:
        """One session: ranges from the queue until it is empty."""
        r = await TableReader.open(self.slot.dsn)
        try:
            await r.import_snapshot(self.slot.snapshot)
            with out:
                while self.queue:
                    await self._range(r, out, *self.queue.pop())
        finally:
            await r.close()

    async def _range(self, r: TableReader, out: trio.MemorySendChannel, ordinal: int,
                     table: SnapshotTable, part: int, blocks: tuple) -> None:
        """One block range of a table (the whole table when it is not split) read into
        ``out``, unless the table cannot be read on the snapshot."""
        split, report, rewritten = self.split, self.report, self.rewritten
        name, key = table.name, (table.name, part)
        if name not in rewritten:
            why = await _unreadable(r, self.check, table)
            if why:
                rewritten.add(name)
                log.event(_log, f"initial snapshot: table {why} after the "
                          "snapshot; it is copied by backfill once streaming",
                          level=WARNING, table=name)
        if name in rewritten:
            return
        if name not in report.tables:
            estimate = self.estimates.get(name)
            if estimate is None:  # read per table when not split
                estimate = await r.estimate(table.table)
            report.start(name, estimate)
        seq = [initial_position(self.cp, ordinal, 0, part)[1]]
        whole = len(split[name]) == 1
        what = f"copying {name}" + ("" if whole else f" (blocks {blocks[0]} to "
                                    f"{'the end' if blocks[1] is None else blocks[1]})")
        # positions past it would be the next range's or table's
        limit = seq[0] + (1 << (TABLE_SHIFT if whole else RANGE_SHIFT))
        self.pending[key] = 0

        async def deliver(batch):
            await self._deliver(out, batch, table, seq, key, limit, what)

        await r.copy(table.select(blocks), deliver, what,
                     text=self.rows.text_path(table.relation))
        self.read.add(key)
        self.unread[name] -= 1
        if not self.unread[name]:
            report.finish(name)
        if not self.pending[key]:
            await self.durable(name, part)

    async def _deliver(self, out: trio.MemorySendChannel, batch, table: SnapshotTable,
                       seq: list, key: tuple, limit: int, what: str) -> None:
        """A batch of a range's rows encoded and sent to the sink, its positions next."""
        if seq[0] + len(batch) > limit:
            raise SourceError(f"{what}: too many rows for the snapshot's "
                              "positions")
        chunk = await encode_chunk(self.rows, table.relation, batch, self.tx, seq[0])
        seq[0] += len(batch)
        self.report.add(table.name, len(batch))
        # nothing awaits between the entry and the send, and blocked senders
        # are served in order: the entries are in the sink's order
        entry = self.acked.sending(key, len(chunk.records))
        self.pending[key] += 1
        try:
            await out.send([chunk])
        except BaseException:
            # a send that raised (cancelled by the drain) delivered nothing
            self.acked.unsent(entry)
            self.pending[key] -= 1
            raise

    async def await_acks(self, acks: trio.MemoryReceiveChannel) -> None:
        """The sink's tickets read until every record sent is durable."""
        acked, pending = self.acked, self.pending
        while not acked.all_durable():
            for ev in await acks.receive():
                kind = type(ev)
                if kind is Registered:
                    acked.registered(ev.ticket)
                elif kind is Acked:
                    for key in acked.done(ev.ticket, ev.records):
                        pending[key] -= 1
                        if not pending[key] and key in self.read:
                            await self.durable(*key)


async def _unreadable(r: TableReader, check: "ShapeCheck | None", table: SnapshotTable
                      ) -> str:
    """Why ``table`` (now locked by ``r``) cannot be read on the exported snapshot with
    the columns the snapshot was planned with, or "" when it can."""
    if await r.rewritten(table.table):
        return "rewritten or truncated"  # or dropped, or renamed
    rel = table.relation
    if check is not None and await check.changed((table.table, (rel.namespace, rel.name))):
        return "altered (its columns changed)"
    return ""


async def _run(*, readers_of, sessions: int, out: trio.MemorySendChannel, cp: int,
               await_acks, acked: AckedPrefix, report: Reporter,
               stop: trio.Event | None) -> bool:
    """``sessions`` readers (``readers_of``) and ``await_acks`` until every record is
    durable; returns whether ``stop`` cancelled the reading."""
    reading = trio.CancelScope()

    async def stop_reading() -> None:
        if stop is not None:
            await stop.wait()
            reading.cancel()

    async with trio.open_nursery() as outer:
        outer.start_soon(report.run)
        outer.start_soon(stop_reading)
        async with trio.open_nursery() as work:
            work.start_soon(await_acks)
            with reading:
                async with trio.open_nursery() as readers:
                    for _ in range(sessions):
                        readers.start_soon(readers_of, out.clone())
            # the readers are done (or stopped): a position with nothing after it lets the
            # sink close its last ticket; what they sent is acknowledged next (or the sink
            # fails the pipeline)
            acked.all_sent = True
            await out.send([Keepalive(cp)])
        outer.cancel_scope.cancel()
    return reading.cancelled_caught


#: the server version from which ``ctid`` ranges are read by TID range scans
TID_RANGE_SCANS = 140000


async def _block_ranges(cfg: Config, tables: list[SnapshotTable]) -> tuple[dict, dict, dict]:
    """The block ranges each table is read in (``router.snapshot.core.block_ranges``): a big
    table is read by every session at once. Not split before PostgreSQL 14 (a ``ctid``
    range would scan the whole table) or with one session. And, of the tables split, the
    planner's row estimate (progress lines: the ranges start at once) and
    ``pg_relation_filenode`` (``router.snapshot.core.done_blocks``)."""
    whole = {t.name: [(0, None)] for t in tables}
    if cfg.snapshot.parallel <= 1 or not tables:
        return whole, {}, {}
    async with session(cfg.source.dsn) as sql:
        if sql.server_version < TID_RANGE_SCANS:
            return whole, {}, {}
        sizes = await sql.fetch(
            "select n.nspname || '.' || c.relname as name, greatest(c.reltuples, 0)::int8 "
            "as estimate, pg_relation_filenode(c.oid)::int8 as filenode, "
            "pg_relation_size(c.oid) / current_setting('block_size')::int8 as blocks "
            "from pg_class c join pg_namespace n on n.oid = c.relnamespace "
            "where (n.nspname, c.relname) in (select * from unnest($1::text[], $2::text[]))",
            [t.table[0] for t in tables], [t.table[1] for t in tables])
    blocks = {r["name"]: int(r["blocks"]) for r in sizes}
    estimate = {r["name"]: int(r["estimate"]) for r in sizes}
    return ({t.name: block_ranges(blocks.get(t.name, 0), cfg.snapshot.parallel,
                                  estimate.get(t.name, 0)) for t in tables}, estimate,
            {r["name"]: int(r["filenode"] or 0) for r in sizes})
