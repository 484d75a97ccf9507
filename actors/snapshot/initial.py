"""The initial snapshot: when the router creates its slot (``[source] create_slot``,
``[snapshot] mode = "initial"``), every table the slot streams and some route takes is
copied into the routes' topics as ``op: "r"`` records before the stream starts.

Rules:

* The slot is created on a replication connection with ``SNAPSHOT 'export'``: its
  consistent point and the exported snapshot describe the same instant — every transaction
  committed before it is in the snapshot, every later one is streamed. That connection
  stays open (and idle) until every reader imported the snapshot and finished.
* Readers (``[snapshot] parallel`` sessions) import the snapshot (REPEATABLE READ) and
  take tables from a shared queue; rows go through the same route semantics as changes
  (``router.snapshot_rows``) and to Kafka through a ``SinkActor`` of their own, with
  positions before the consistent point (``router.snapshot``).
* SnapshotState (``actors.snapshot.store``): ``started`` is written before the slot is created,
  ``done`` after Kafka acknowledged every snapshot record; only then does the stream start
  (from the consistent point: nothing missed, nothing read twice). The slot's position is
  not confirmed by anything here.
* A table whose records Kafka acknowledged is recorded done, per route. A start that finds
  its slot with an initial snapshot ``started`` but not ``done`` (the router was killed
  while copying) finishes it as a backfill of the routed tables not recorded done
  (``actors.snapshot.backfill``): the slot streams from its consistent point, so every change
  since the rows already written is in the stream, and those tables are read again by key
  chunks between watermarks (rows of the tables in flight are written twice).
"""

from __future__ import annotations

import time

import psycopg2
import psycopg2.errors
import psycopg2.extras
import trio

from router.config import Config
from router.envelope import TxContext
from router.errors import (ConfigError, PublicationMissing, SlotInUse, SourceError,
                           SourceUnavailable)
from router.lsn import format_lsn, parse_lsn
from router.routing import ChangeRouter
from router.snapshot import SnapshotState, TABLE_SHIFT, initial_position
from router.snapshot_rows import SnapshotRows

from router.topics import TopicSpec

from ..services import failover
from ..pipeline.mailbox import CHUNKS, Acked
from ..pipeline.sink import SinkActor, record_reshaper
from ..services import log
from ..services.catalog import load_catalog, load_primary_keys
from ..services.sql import SqlSession
from .reader import TableReader, session
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


async def type_names(sql: SqlSession, tables: list[SnapshotTable]) -> dict[int, str]:
    """Names of the non-built-in column types, as the stream's Type messages give them."""
    oids = sorted({c.type_oid for t in tables for c in t.relation.columns})
    names = {}
    for r in await sql.fetch("select t.oid::int8 as oid, n.nspname, t.typname from pg_type t "
                             "join pg_namespace n on n.oid = t.typnamespace "
                             "where t.oid = any($1::oid[])", oids):
        names[r["oid"]] = r["typname"] if r["nspname"] == "pg_catalog" else \
            f"{r['nspname']}.{r['typname']}"
    return names


def topic_specs(cfg: Config) -> dict[str, TopicSpec]:
    specs = {r.name: TopicSpec(r.name, r.topic_settings.partitions,
                               r.topic_settings.replication_factor, r.topic_settings.configs)
             for r in cfg.routes}
    specs[""] = TopicSpec("", 1, max((s.replication_factor for s in specs.values()), default=1))
    return specs


async def ensure_initial_snapshot(cfg: Config, client_factory,
                                  stop: trio.Event | None = None) -> list[str]:
    """Runs before the stream starts. Returns the tables ("schema.table") an interrupted
    initial snapshot left unfinished (to be finished by backfill), usually none. ``stop``
    set (a drain: SIGTERM) stops the copy: what was read is flushed to Kafka, tables whose
    records are all acknowledged are recorded done, and the snapshot stays "started", so the
    next start finishes it by backfill, as after a crash, but without copying twice."""
    src = cfg.source
    if cfg.snapshot.mode != "initial" or not src.create_slot:
        return []
    async with session(src.dsn) as sql:
        exists = await sql.fetchval("select exists (select 1 from pg_replication_slots "
                                    "where slot_name = $1)", src.slot)
        client = await trio.to_thread.run_sync(client_factory, cfg)
        try:
            store = StateStore(cfg, client)
            await store.aload()
            state = store.get(SnapshotState("initial", src.slot, ""))
            if exists:
                if state is None or state.state == "done":
                    return []
                log.event(_log, "initial snapshot was interrupted; finishing it by backfill",
                          slot=src.slot)
                return ["*"]
            await store.aput(SnapshotState("initial", src.slot, "started"))
            await _snapshot(cfg, sql, client, store, stop if stop is not None else trio.Event())
            return []
        finally:
            with trio.move_on_after(15) as scope:
                scope.shield = True
                await trio.to_thread.run_sync(client.close, 10.0)


async def _snapshot(cfg: Config, sql: SqlSession, client, store: StateStore,
                    stop: trio.Event) -> None:
    src = cfg.source
    catalog = await load_catalog(sql, cfg)
    db = await sql.fetchval("select current_database()")
    # what preflight refuses, refused before the slot exists (a slot made without them would
    # start with an empty snapshot recorded done)
    wal_level = await sql.fetchval("select current_setting('wal_level')")
    if wal_level != "logical":
        raise ConfigError(f"the server has wal_level={wal_level}; logical decoding needs "
                          "wal_level=logical (and a restart)", path="source.dsn")
    missing = [p for p in src.publications if p not in catalog.publications]
    if missing:
        raise PublicationMissing(f"publication(s) {', '.join(missing)} do not exist in "
                                 f"database {db}")
    await failover.check_server(sql, src, int(await sql.fetchval(
        "select current_setting('server_version_num')")))
    slot = await trio.to_thread.run_sync(ExportedSlot, src.dsn, src.slot, src.two_phase,
                                         src.failover)
    log.event(_log, "replication slot created with an exported snapshot", slot=src.slot,
              consistent_point=format_lsn(slot.consistent_point), snapshot=slot.snapshot)
    try:
        tables = slot_tables(cfg, catalog)
        names = await type_names(sql, tables)
        # records keyed as the stream keys them (the primary key whenever there is one)
        rows = SnapshotRows(ChangeRouter(snapshot_specs(cfg, catalog), db=db, type_names=names,
                                         primary_keys=await load_primary_keys(sql)),
                            position_headers=cfg.kafka.position_headers)
        tables = [t for t in tables if rows.routed(t.relation)]
        complete = await copy_tables(cfg, client, tables, rows, slot, store, stop)
    finally:
        await trio.to_thread.run_sync(slot.close)
    if not complete:
        log.event(_log, "initial snapshot stopped by the drain; the next start finishes it by "
                  "backfill", slot=src.slot)
        return
    await store.aput(SnapshotState("initial", src.slot, "done"))
    log.event(_log, "initial snapshot done; streaming from the consistent point",
              slot=src.slot, consistent_point=format_lsn(slot.consistent_point))


async def copy_tables(cfg: Config, client, tables: list[SnapshotTable], rows: SnapshotRows,
                      slot: ExportedSlot, store: StateStore,
                      stop: trio.Event | None = None) -> bool:
    """Every table of ``tables`` into Kafka, read in ``parallel`` sessions on the exported
    snapshot; returns once Kafka acknowledged every record. A table whose records are all
    acknowledged is recorded done (per route) in the progress topic: if the snapshot is
    interrupted, finishing it by backfill leaves that table alone. ``stop`` set stops the
    reading where it is (what was read is still flushed and acknowledged); returns whether
    every table was read."""
    cp = slot.consistent_point
    tx = TxContext(xid=0, commit_lsn=initial_position(cp, 0, 0)[0], end_lsn=cp,
                   commit_time=int((time.time() - _PG_EPOCH) * 1_000_000))
    report = Reporter("initial snapshot", cfg.log.progress_interval)
    chunk_tx, chunk_rx = trio.open_memory_channel(CHUNKS)
    prog_tx, prog_rx = trio.open_memory_channel(CHUNKS * 4)
    sink = SinkActor(client=client, inbox=chunk_rx, progress=prog_tx,
                     schema_topic=cfg.kafka.schema_topic, topic_specs=topic_specs(cfg),
                     create_topics=cfg.kafka.create_topics)
    sink.reshape = record_reshaper(cfg)  # one encoding for every record source
    queue = list(enumerate(tables))
    queue.reverse()
    # the sink numbers chunks in the order they reach it, one ticket each (every chunk is
    # final): ``order[ticket]`` is the chunk's table. Nothing awaits between the append and
    # the send, and blocked senders are served in order, so the channel keeps that order.
    order: list[str] = []
    pending = {t.name: 0 for t in tables}
    read: set[str] = set()
    routes_of = {t.name: sorted({p.route for p in rows.router.plans_for(t.relation)})
                 for t in tables}

    async def durable(name: str) -> None:
        for route in routes_of[name]:
            await store.aput(SnapshotState("backfill", cfg.source.slot, "done", request="initial",
                                      route=route, table=name))

    async def reader(out: trio.MemorySendChannel) -> None:
        r = await TableReader.open(cfg.source.dsn)
        try:
            await r.import_snapshot(slot.snapshot)
            with out:
                while queue:
                    ordinal, table = queue.pop()
                    report.start(table.name, await r.estimate(table.table))
                    seq = [initial_position(cp, ordinal, 0)[1]]

                    async def deliver(batch, table=table, seq=seq):
                        chunk = rows.chunk(table.relation, batch, tx, seq[0])
                        seq[0] += len(batch)
                        report.add(table.name, len(batch))
                        order.append(table.name)
                        pending[table.name] += 1
                        await out.send([chunk])

                    n = await r.copy(table.select(), deliver, f"copying {table.name}")
                    if n >= 1 << TABLE_SHIFT:
                        raise SourceError(f"table {table.name} has more than 2^40 rows")
                    report.finish(table.name)
                    read.add(table.name)
                    if not pending[table.name]:
                        await durable(table.name)
        finally:
            await r.close()

    async def acks() -> None:
        async for events in prog_rx:
            for ev in events:
                if type(ev) is Acked:
                    name = order[ev.ticket]
                    pending[name] -= 1
                    if not pending[name] and name in read:
                        await durable(name)

    reading = trio.CancelScope()

    async def stop_reading() -> None:
        if stop is not None:
            await stop.wait()
            reading.cancel()

    async with trio.open_nursery() as outer:
        outer.start_soon(report.run)
        outer.start_soon(stop_reading)
        async with trio.open_nursery() as work:
            work.start_soon(acks)
            await work.start(sink.run)
            async with chunk_tx:
                with reading:
                    async with trio.open_nursery() as readers:
                        for _ in range(max(1, min(cfg.snapshot.parallel, len(tables)))):
                            readers.start_soon(reader, chunk_tx.clone())
            # the readers are done (or stopped); the sink drains and returns once Kafka
            # acknowledged every record it was given (or raises)
        outer.cancel_scope.cancel()
    report.summary()
    return not reading.cancelled_caught and len(read) == len(tables)
