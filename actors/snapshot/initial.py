"""The initial snapshot: when the router creates its slot (``[source] create_slot``,
``[snapshot] mode = "initial"``), every table the slot streams and some route takes is
copied into the routes' topics as ``op: "r"`` records before the stream starts. It is a
source of the pipeline, as a backfill is: its chunks go to the pipeline's one sink (plain or
transactional, the configured record format), under the supervisor.

Rules:

* ``InitialSnapshot.wanted``: the mode asks for it and the slot does not exist yet.
  ``create_slot`` records ``started`` in the state topic (``actors.snapshot.store``), then
  creates the slot on a replication connection with ``SNAPSHOT 'export'``: its consistent
  point and the exported snapshot describe the same instant — every transaction committed
  before it is in the snapshot, every later one is streamed. That connection stays open (and
  idle) until every reader imported the snapshot and finished (``close``).
* ``run`` (the supervisor calls it in the pipeline, after the sink started and before the
  slot reader does): readers (``[snapshot] parallel`` sessions) import the snapshot
  (REPEATABLE READ) and take tables from a shared queue; rows go through the same route
  semantics as changes (``router.snapshot_rows``) into the sink's inbox, with positions
  before the consistent point (``router.snapshot``). It reads the sink's tickets itself
  until Kafka acknowledged every snapshot record (in exactly-once mode: until the Kafka
  transactions holding them committed); only then does the stream start, from the
  consistent point: nothing missed, nothing read twice. It confirms nothing.
* A table whose records Kafka acknowledged is recorded done, per route; ``done`` is recorded
  for the snapshot once every table is.
* A start that finds its slot with an initial snapshot ``started`` but not ``done`` (the
  router was killed or drained while copying: ``interrupted``) finishes it as a backfill of
  the routed tables not recorded done (``actors.snapshot.backfill``): the slot streams from
  its consistent point, so every change since the rows already written is in the stream,
  and those tables are read again by key chunks between watermarks (rows of the tables in
  flight are written twice).
* A table is locked before it is read (``TableReader.rewritten``). One that TRUNCATE or a
  rewrite (ALTER TABLE … TYPE, ADD COLUMN with a volatile default, VACUUM FULL, CLUSTER)
  gave a new file after the consistent point — before any session locked it — cannot be
  read on the exported snapshot (its rows are invisible to it, or moved): it is not copied
  (one warning line), and once the other tables are in Kafka the stream starts and that
  table is copied by backfill, as after an interrupted snapshot (``left``). So is a table
  dropped or renamed since, and one whose columns or partition parents changed since they
  were read before the catalog (``ShapeCheck``: ADD/DROP/RENAME COLUMN keep the file, but
  the read would name the planned columns). Tables being read hold their lock until the
  copy ends, so a rewrite of one waits for it.
"""

from __future__ import annotations

import time
import uuid
from logging import WARNING

import psycopg2
import psycopg2.errors
import psycopg2.extras
import trio

from router.config import Config
from router.envelope import TxContext
from router.errors import SlotInUse, SourceError, SourceUnavailable
from router.lsn import format_lsn, parse_lsn
from router.routing import ChangeRouter
from router.snapshot import RANGE_SHIFT, TABLE_SHIFT, SnapshotState, initial_position
from router.snapshot_ranges import block_ranges
from router.snapshot_rows import SnapshotRows

from ..pipeline.mailbox import Acked, Keepalive, Registered
from ..services import log
from ..services.catalog import load_catalog, load_primary_keys
from ..services.sql import SqlSession
from .jobs import table_shapes
from .reader import ShapeCheck, TableReader, encode_chunk, session
from .report import Reporter
from .store import StateStore
from .tables import SnapshotTable, slot_tables, snapshot_specs

_log = log.get("snapshot")
_PG_EPOCH = 946684800


class ExportedSlot:
    """A slot created with an exported snapshot, on a replication connection kept open."""

    def __init__(self, dsn: str, slot: str, two_phase: bool, failover: bool = False):
        try:
            self.conn = psycopg2.connect(
                dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
            cur = self.conn.cursor()
            opts = ("SNAPSHOT 'export'" + (", TWO_PHASE" if two_phase else "")
                    + (", FAILOVER" if failover else ""))  # source.failover, 17+
            cur.execute(f'CREATE_REPLICATION_SLOT "{slot.replace(chr(34), "")}" LOGICAL '
                        f"pgoutput ({opts})")
            row = cur.fetchone()
        except psycopg2.errors.DuplicateObject as exc:
            raise SlotInUse(f"replication slot {slot!r} was created by someone else: "
                            f"{exc}".strip()) from exc
        except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
            raise SourceUnavailable(f"cannot create slot {slot!r}: {exc}".strip()) from exc
        except psycopg2.Error as exc:
            raise SourceError(f"cannot create slot {slot!r}: {exc}".strip()) from exc
        self.consistent_point = parse_lsn(row[1])
        self.snapshot = row[2]

    def close(self) -> None:
        try:
            self.conn.close()
        except psycopg2.Error:
            pass


#: each type as pgoutput's Type message names it (``logicalrep_write_typ``): a domain by its
#: base type (through every level of domains), anything else by itself
_TYPE_NAMES = """with recursive d(oid, base) as (
    select t.oid, t.oid from pg_type t where t.oid = any($1::oid[])
    union all
    select d.oid, t.typbasetype from d join pg_type t on t.oid = d.base where t.typtype = 'd')
select d.oid::int8 as oid, n.nspname, b.typname from d
join pg_type b on b.oid = d.base join pg_namespace n on n.oid = b.typnamespace
where b.typtype <> 'd'"""


async def type_names(sql: SqlSession, tables: list[SnapshotTable]) -> dict[int, str]:
    """Names of the column types as the stream's Type messages give them, so a table's
    snapshot, backfill and verify rows share the stream's schema (a domain column is typed
    as its base type on every path)."""
    oids = sorted({c.type_oid for t in tables for c in t.relation.columns})
    names = {}
    for r in await sql.fetch(_TYPE_NAMES, oids):
        names[r["oid"]] = r["typname"] if r["nspname"] == "pg_catalog" else \
            f"{r['nspname']}.{r['typname']}"
    return names


class InitialSnapshot:
    """One initial snapshot: its slot created with an exported snapshot, then its tables
    copied into the pipeline's sink."""

    def __init__(self, cfg: Config, client):
        self.cfg = cfg
        self.store = StateStore(cfg, client)
        #: the sink's client produces packed records in C (plain sink, pgrouter's JSON)
        self.packed = cfg.kafka.format == "json" and getattr(client, "takes_packed", False)
        self.slot: ExportedSlot | None = None
        self.rows: SnapshotRows | None = None
        self.tables: list[SnapshotTable] = []
        self.shapes: dict = {}
        #: tables rewritten during the copy, not copied: to finish by backfill
        self.left: list[str] = []

    @staticmethod
    async def wanted(sql: SqlSession, cfg: Config) -> bool:
        """The config asks for an initial snapshot and the slot is still to be created."""
        src = cfg.source
        if cfg.snapshot.mode != "initial" or not src.create_slot:
            return False
        return not await sql.fetchval("select exists (select 1 from pg_replication_slots "
                                      "where slot_name = $1)", src.slot)

    async def create_slot(self) -> None:
        """The tables to copy read (a config the catalog refuses stops here, before any
        slot exists), ``started`` recorded, then the slot created with an exported
        snapshot."""
        cfg, src = self.cfg, self.cfg.source
        async with session(src.dsn) as sql:
            # the columns before the catalog: a table whose columns change after this is
            # not read with the catalog's (``ShapeCheck``)
            self.shapes = await table_shapes(sql)
            catalog = await load_catalog(sql, cfg)
            db = await sql.fetchval("select current_database()")
            tables = slot_tables(cfg, catalog)
            names = await type_names(sql, tables)
            pks = await load_primary_keys(sql)
        # records keyed as the stream keys them (the primary key whenever there is one)
        self.rows = SnapshotRows(ChangeRouter(snapshot_specs(cfg, catalog), db=db,
                                              type_names=names, primary_keys=pks),
                                 position_headers=cfg.kafka.position_headers,
                                 packed=self.packed)
        self.tables = [t for t in tables if self.rows.routed(t.relation)]
        await self.store.aload()
        await self.store.forget_initial(src.slot)
        # a name of this snapshot for its range records (``router.snapshot_ranges``)
        await self.store.aput(SnapshotState("initial", src.slot, "started",
                                            request=uuid.uuid4().hex))
        self.slot = await trio.to_thread.run_sync(ExportedSlot, src.dsn, src.slot,
                                                  src.two_phase, src.failover)
        log.event(_log, "replication slot created with an exported snapshot", slot=src.slot,
                  consistent_point=format_lsn(self.slot.consistent_point),
                  snapshot=self.slot.snapshot,
                  records="packed, produced in C" if self.packed else "produced by the client")

    def close(self) -> None:
        if self.slot is not None:
            self.slot.close()

    async def run(self, out: trio.MemorySendChannel, acks: trio.MemoryReceiveChannel,
                  stop: trio.Event) -> bool:
        """Every routed table into ``out`` (the sink's inbox; closed on return), returning
        once Kafka acknowledged every record (``acks``: the sink's tickets). Returns whether
        the stream may start: the snapshot is done, or every table was copied but those of
        ``left`` (rewritten during the copy: the caller has them copied by backfill,
        ``actors.snapshot.backfill.finish_initial``). ``stop`` set (a drain) stops the
        copy: what was read is still delivered, tables whose records are all acknowledged
        are recorded done, and the snapshot stays "started", so the next start finishes it
        by backfill, as after a crash, but without copying twice."""
        cfg, src, slot = self.cfg, self.cfg.source, self.slot
        with out:
            try:
                left = await copy_tables(cfg, out, acks, self.tables, self.rows, slot,
                                         self.store, stop, self.shapes)
            finally:
                await trio.to_thread.run_sync(self.close)
        if left is None:
            log.event(_log, "initial snapshot stopped by the drain; the next start finishes "
                      "it by backfill", slot=src.slot)
            return False
        if left:  # stays "started": the backfill records it done
            self.left = left
            log.event(_log, "initial snapshot copied; the tables rewritten during it are "
                      "copied by backfill once streaming", slot=src.slot, tables=",".join(left))
            return True
        await self.store.aput(SnapshotState("initial", src.slot, "done"))
        log.event(_log, "initial snapshot done; streaming from the consistent point",
                  slot=src.slot, consistent_point=format_lsn(slot.consistent_point))
        return True


async def interrupted(cfg: Config, client) -> list[str]:
    """``["*"]`` when the slot's initial snapshot was started and not done (to be finished
    by backfill), else none. The slot exists (``InitialSnapshot.wanted`` said no)."""
    if cfg.snapshot.mode != "initial" or not cfg.source.create_slot:
        return []
    store = StateStore(cfg, client)
    await store.aload()
    state = store.get(SnapshotState("initial", cfg.source.slot, ""))
    if state is None or state.state == "done":
        return []
    log.event(_log, "initial snapshot was interrupted; finishing it by backfill",
              slot=cfg.source.slot)
    return ["*"]


async def copy_tables(cfg: Config, out: trio.MemorySendChannel,
                      acks: trio.MemoryReceiveChannel, tables: list[SnapshotTable],
                      rows: SnapshotRows, slot: ExportedSlot, store: StateStore,
                      stop: trio.Event | None = None, shapes: dict | None = None
                      ) -> list[str] | None:
    """Every table of ``tables`` into ``out``, read in ``parallel`` sessions on the exported
    snapshot; returns once Kafka acknowledged every record (``acks``). A table whose records
    are all acknowledged is recorded done (per route) in the state topic: if the snapshot is
    interrupted, finishing it by backfill leaves that table alone. ``stop`` set stops the
    reading where it is (what was read is still delivered and acknowledged). Returns the
    tables not copied because they were rewritten after the snapshot (``rewritten``) or
    their columns changed since ``shapes`` were read (``ShapeCheck``), or None when
    ``stop`` left some unread."""
    cp = slot.consistent_point
    tx = TxContext(xid=0, commit_lsn=initial_position(cp, 0, 0)[0], end_lsn=cp,
                   commit_time=int((time.time() - _PG_EPOCH) * 1_000_000))
    report = Reporter("initial snapshot", cfg.log.progress_interval)
    split, estimates, filenodes = await _block_ranges(cfg, tables)
    started = store.get(SnapshotState("initial", cfg.source.slot, ""))
    snapshot = started.request if started is not None else ""
    # (table ordinal, table, range ordinal, blocks): the ranges of one table follow each
    # other, so every session reads the big table when it comes
    queue = [(o, t, i, b) for o, t in enumerate(tables) for i, b in enumerate(split[t.name])]
    sessions = max(1, min(cfg.snapshot.parallel, len(queue)))
    queue.reverse()
    acked = _AckedPrefix()
    pending: dict[tuple, int] = {}  # chunks sent and not known durable, per (table, range)
    read: set[tuple] = set()  # (table, range) read whole
    unread = {t.name: len(split[t.name]) for t in tables}  # ranges not read whole
    undone = dict(unread)  # ranges whose records are not all durable
    rewritten: set[str] = set()  # not readable on the snapshot: left to a backfill
    check = ShapeCheck(cfg.source.dsn, shapes) if shapes is not None else None
    routes_of = {t.name: sorted({p.route for p in rows.router.plans_for(t.relation)})
                 for t in tables}

    async def durable(name: str, part: int) -> None:
        """All records of a range are in Kafka: recorded (when the table is split), and
        the table done once every range is."""
        if len(split[name]) > 1:
            first, end = split[name][part]
            await store.aput(SnapshotState(
                "range", cfg.source.slot, "done", request=snapshot, table=name,
                blocks=(first, -1 if end is None else end), filenode=filenodes.get(name, 0)))
            log.event(_log, "initial snapshot: range done", table=name,
                      blocks=f"{first}-{'' if end is None else end}")
        undone[name] -= 1
        if undone[name]:
            return
        for route in routes_of[name]:
            await store.aput(SnapshotState("backfill", cfg.source.slot, "done", request="initial",
                                      route=route, table=name))

    async def reader(out: trio.MemorySendChannel) -> None:
        r = await TableReader.open(cfg.source.dsn)
        try:
            await r.import_snapshot(slot.snapshot)
            with out:
                while queue:
                    ordinal, table, part, blocks = queue.pop()
                    name, key = table.name, (table.name, part)
                    if name not in rewritten:
                        why = await _unreadable(r, check, table)
                        if why:
                            rewritten.add(name)
                            log.event(_log, f"initial snapshot: table {why} after the "
                                      "snapshot; it is copied by backfill once streaming",
                                      level=WARNING, table=name)
                    if name in rewritten:
                        continue
                    if name not in report.tables:
                        estimate = estimates.get(name)
                        if estimate is None:  # read per table when not split
                            estimate = await r.estimate(table.table)
                        report.start(name, estimate)
                    seq = [initial_position(cp, ordinal, 0, part)[1]]
                    whole = len(split[name]) == 1
                    what = f"copying {name}" + ("" if whole else f" (blocks {blocks[0]} to "
                                                f"{'the end' if blocks[1] is None else blocks[1]})")
                    # positions past it would be the next range's or table's
                    limit = seq[0] + (1 << (TABLE_SHIFT if whole else RANGE_SHIFT))
                    pending[key] = 0

                    async def deliver(batch, table=table, seq=seq, key=key, limit=limit,
                                      what=what):
                        if seq[0] + len(batch) > limit:
                            raise SourceError(f"{what}: too many rows for the snapshot's "
                                              "positions")
                        chunk = await encode_chunk(rows, table.relation, batch, tx, seq[0])
                        seq[0] += len(batch)
                        report.add(table.name, len(batch))
                        # nothing awaits between the entry and the send, and blocked senders
                        # are served in order: the entries are in the sink's order
                        entry = acked.sending(key, len(chunk.records))
                        pending[key] += 1
                        try:
                            await out.send([chunk])
                        except BaseException:
                            # a send that raised (cancelled by the drain) delivered nothing
                            acked.unsent(entry)
                            pending[key] -= 1
                            raise

                    await r.copy(table.select(blocks), deliver, what,
                                 text=rows.text_path(table.relation))
                    read.add(key)
                    unread[name] -= 1
                    if not unread[name]:
                        report.finish(name)
                    if not pending[key]:
                        await durable(name, part)
        finally:
            await r.close()

    async def await_acks() -> None:
        while not acked.all_durable():
            for ev in await acks.receive():
                kind = type(ev)
                if kind is Registered:
                    acked.registered(ev.ticket)
                elif kind is Acked:
                    for key in acked.done(ev.ticket, ev.records):
                        pending[key] -= 1
                        if not pending[key] and key in read:
                            await durable(*key)

    try:
        cancelled = await _run(readers_of=reader, sessions=sessions, out=out, cp=cp,
                               await_acks=await_acks, acked=acked, report=report, stop=stop)
    finally:
        if check is not None:
            await check.close()
    report.summary()
    if cancelled or any(n for name, n in unread.items() if name not in rewritten):
        return None
    return sorted(rewritten)


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
               await_acks, acked: "_AckedPrefix", report: Reporter,
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
    """The block ranges each table is read in (``router.snapshot.block_ranges``): a big
    table is read by every session at once. Not split before PostgreSQL 14 (a ``ctid``
    range would scan the whole table) or with one session. And, of the tables split, the
    planner's row estimate (progress lines: the ranges start at once) and
    ``pg_relation_filenode`` (``router.snapshot.done_blocks``)."""
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
                                  estimate.get(t.name, 0)) for t in tables}, {r["name"]: int(r["estimate"]) for r in sizes},
            {r["name"]: int(r["filenode"] or 0) for r in sizes})


class _AckedPrefix:
    """Which snapshot chunks Kafka holds, from the sink's tickets. The sink may put several
    consecutive chunks under one ticket (tickets are consecutive and cover consecutive
    chunks), so a chunk is durable once every ticket up to the one holding it is: the
    records of that prefix of tickets reach past the chunk's last record."""

    def __init__(self):
        self.entries: list[list] = []  # [(table, range), records] per chunk, in the sink's order
        self.first = 0                 # entries before it are known durable
        self.through = 0               # records of those entries
        self.durable_records = 0       # records of the acknowledged prefix of tickets
        self.next_ticket: int | None = None
        self.out_of_order: dict[int, int] = {}  # acknowledged after a gap: ticket -> records
        self.all_sent = False

    def sending(self, key: tuple, records: int) -> list:
        entry = [key, records]
        self.entries.append(entry)
        return entry

    def unsent(self, entry: list) -> None:
        for i in range(len(self.entries) - 1, self.first - 1, -1):
            if self.entries[i] is entry:
                del self.entries[i]
                return

    def registered(self, ticket: int) -> None:
        if self.next_ticket is None:
            self.next_ticket = ticket

    def done(self, ticket: int, records: int) -> list[tuple]:
        """A ticket acknowledged: the (table, range) of the chunks now known durable (one
        per chunk)."""
        self.out_of_order[ticket] = records
        while self.next_ticket in self.out_of_order:
            self.durable_records += self.out_of_order.pop(self.next_ticket)
            self.next_ticket += 1
        names = []
        entries = self.entries
        while self.first < len(entries) and (
                self.through + entries[self.first][1] <= self.durable_records):
            self.through += entries[self.first][1]
            names.append(entries[self.first][0])
            self.first += 1
        return names

    def all_durable(self) -> bool:
        return self.all_sent and self.first == len(self.entries) and not self.out_of_order
