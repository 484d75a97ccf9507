"""The initial snapshot: when the router creates its slot (``[source] create_slot``,
``[snapshot] mode = "initial"``), every table the slot streams and some route takes is
copied into the routes' topics as ``op: "r"`` records before the stream starts. It is a
source of the pipeline, as a backfill is: its chunks go to the pipeline's one sink (plain or
transactional, the configured record format), before the stream, under the start-up's
coordinator (``actors.runner.coordinator``), to which it returns a ``SnapshotResult``.

Rules:

* ``InitialSnapshot.wanted``: the mode asks for it and the slot does not exist yet.
  ``create_slot`` records ``started`` in the state topic (``actors.snapshot.store``), then
  has the start's ``Source`` create the slot with an exported snapshot
  (``actors.services.slots.ExportedSlot``): its consistent
  point and the exported snapshot describe the same instant — every transaction committed
  before it is in the snapshot, every later one is streamed. That connection stays open (and
  idle) until every reader imported the snapshot and finished (``close``).
* The tables to copy are planned in the exported snapshot (a session that imported it reads
  the publications, their row filters and column lists, the tables' columns, keys and
  shapes): the publications as of the consistent point. The start's checks read the
  catalog before the slot exists; a table added to a publication between that read and the
  consistent point (the slot's creation waits for the transactions running when it
  begins) has its rows in the snapshot and none in the stream, so it is copied; a table
  dropped from it meanwhile is not.
* ``run`` (the coordinator calls it after the sink started and before the slot reader
  does) copies the tables (``actors.snapshot.initial_copy``): readers
  (``[snapshot] parallel`` sessions) import the snapshot (REPEATABLE READ) and take tables
  from a shared queue; rows go through the same route semantics as changes
  (``router.snapshot.rows``) into the sink's inbox, with positions before the consistent
  point (``router.snapshot.core``). It reads the sink's tickets itself until Kafka acknowledged
  every snapshot record (in exactly-once mode: until the Kafka transactions holding them
  committed); only then does the stream start, from the consistent point: nothing missed,
  nothing read twice. It confirms nothing (why it reads the tickets where the stream and
  the backfills rely on the confirmed position: ``actors.runner.coordinator``).
* A table whose records Kafka acknowledged is recorded done, per route; ``done`` is recorded
  for the snapshot once every table is.
* A start that finds its slot with an initial snapshot ``started`` but not ``done`` (the
  router was killed or drained while copying: ``interrupted``) finishes it as a backfill of
  the routed tables not recorded done (``actors.snapshot.backfill``): the slot streams from
  its consistent point, so every change since the rows already written is in the stream,
  and those tables are read again by key chunks between watermarks (rows of the tables in
  flight are written twice).
  So does a start that finds its slot and no state topic at all (``StateStore.created``:
  deleted, or a new cluster): nothing says the snapshot finished, so every routed table is
  read again (one warning line; ``started`` is recorded first). A topic that exists
  without a record of the slot (a slot made by hand) means no snapshot: the router streams.
* A table is locked before it is read (``TableReader.rewritten``). One that TRUNCATE or a
  rewrite (ALTER TABLE … TYPE, ADD COLUMN with a volatile default, VACUUM FULL, CLUSTER)
  gave a new file after the consistent point — before any session locked it — cannot be
  read on the exported snapshot (its rows are invisible to it, or moved): it is not copied
  (one warning line), and once the other tables are in Kafka the stream starts and that
  table is copied by backfill, as after an interrupted snapshot (``left``). So is a table
  dropped or renamed since, and one whose columns or partition parents changed since the
  consistent point (``ShapeCheck``: ADD/DROP/RENAME COLUMN keep the file, but the read
  would name the planned columns). Tables being read hold their lock until the
  copy ends, so a rewrite of one waits for it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from logging import WARNING

import trio

from router.config.router import Config
from router.postgres.lsn import format_lsn
from router.formats.record_format import record_format
from router.routing.change_router import ChangeRouter
from router.routing.publications import Catalog
from router.snapshot.core import SnapshotState
from router.snapshot.rows import SnapshotRows

from ..kafka.contracts import PackedProducer
from ..services import log
from ..services.catalog import load_catalog, load_primary_keys, require_publications
from ..services.sql import SqlSession
from .column_types import type_names
from ..services.slots import ExportedSlot
from .initial_copy import copy_tables
from .reader import import_snapshot
from .jobs import table_shapes
from .store import StateRead, StateStore
from .tables import SnapshotTable, slot_tables, snapshot_specs

_log = log.get("snapshot")


@dataclass(frozen=True)
class SnapshotResult:
    """What an initial snapshot hands the start-up (``actors.runner.coordinator``)."""
    consistent_point: int  # the slot's: the stream starts there
    done: tuple[str, ...]  # tables whose records Kafka holds, recorded done
    left: tuple[str, ...] = ()  # rewritten while it ran: copied by backfill once streaming
    stopped: bool = False  # a drain stopped it: the stream does not start


@dataclass
class Begun:
    """What a start that will copy an initial snapshot began before its checks
    (``InitialSnapshot.begin``): the state topic's read, running while they do, then the
    catalog the checks read (set by the start)."""
    read: StateRead
    catalog: Catalog | None = None


class InitialSnapshot:
    """One initial snapshot: its slot created with an exported snapshot, then its tables
    copied into the pipeline's sink."""

    def __init__(self, cfg: Config, client, source, begun: "Begun | None" = None):
        self.cfg = cfg
        #: the start's ``Source`` (``actors.runner.source``): the slot, its creation
        self.source = source
        self.begun = begun
        self.store = StateStore(cfg, client, source.slot, begun and begun.read)
        #: the sink's client produces packed records in C (plain sink, a format that keeps
        #: the router's records: pgrouter's JSON)
        self.packed = (record_format(cfg.kafka).packs and isinstance(client, PackedProducer)
                       and client.takes_packed)
        self.slot: ExportedSlot | None = None
        self.rows: SnapshotRows | None = None
        self.tables: list[SnapshotTable] = []
        self.shapes: dict = {}

    @staticmethod
    async def wanted(sql: SqlSession, cfg: Config, source) -> bool:
        """The config asks for an initial snapshot and the slot is still to be created."""
        if cfg.snapshot.mode != "initial" or not cfg.source.create_slot:
            return False
        return not await source.exists(sql)

    @staticmethod
    async def begin(sql: SqlSession, cfg: Config, source) -> "Begun | None":
        """When ``wanted``, at a start before its checks: the state topic's read begun."""
        if not await InitialSnapshot.wanted(sql, cfg, source):
            return None
        return Begun(StateRead(cfg, source.slot))

    async def create_slot(self, sql: SqlSession) -> None:
        """The publications checked on the start's session ``sql`` (a config the catalog
        refuses stops here, before any slot exists), ``started`` recorded, the slot created
        with an exported snapshot, then the tables to copy planned in that snapshot
        (``_plan``)."""
        cfg, source = self.cfg, self.source
        async with trio.open_nursery() as reading:
            # the state topic in a worker thread while PostgreSQL answers (or the read
            # ``begin`` started, taken)
            reading.start_soon(self.store.aload)
            begun = self.begun
            if begun is not None and begun.catalog is not None:
                require_publications(cfg, begun.catalog.publications)
            else:
                await load_catalog(sql, cfg)
        await self.store.forget_initial(source.slot)
        # a name of this snapshot for its range records (``router.snapshot.ranges``)
        await self.store.aput(SnapshotState("initial", source.slot, "started",
                                            request=uuid.uuid4().hex))
        self.slot = await trio.to_thread.run_sync(source.export)
        log.event(_log, "replication slot created with an exported snapshot", slot=source.slot,
                  consistent_point=format_lsn(self.slot.consistent_point),
                  snapshot=self.slot.snapshot,
                  records="packed, produced in C" if self.packed else "produced by the client")
        await self._plan(sql)

    async def _plan(self, sql: SqlSession) -> None:
        """The tables to copy, their routes, columns and keys read in the exported snapshot
        (imported by the start's session ``sql``, in a transaction of its own): the
        publications' tables as of the consistent point.
        A table added to a publication after the start's catalog and before the slot's
        consistent point is copied (its rows are in the snapshot, the stream never carries
        them); one dropped from it then is not. The tables' shapes too (``ShapeCheck``: a
        table altered after the consistent point is left to a backfill)."""
        cfg, slot = self.cfg, self.slot
        await import_snapshot(sql, slot.snapshot)
        try:
            self.shapes = await table_shapes(sql)
            catalog = await load_catalog(sql, cfg)
            db = await sql.fetchval("select current_database()")
            tables = slot_tables(cfg, catalog)
            names = await type_names(sql, tables)
            pks = await load_primary_keys(sql)
        finally:
            if sql.in_transaction:
                await sql.execute("ROLLBACK")  # read only: nothing to keep
        # records keyed as the stream keys them (the primary key whenever there is one)
        self.rows = SnapshotRows(ChangeRouter(snapshot_specs(cfg, catalog), db=db,
                                              type_names=names, primary_keys=pks),
                                 position_headers=cfg.kafka.position_headers,
                                 packed=self.packed)
        self.tables = [t for t in tables if self.rows.routed(t.relation)]

    def close(self) -> None:
        if self.slot is not None:
            self.slot.close()

    async def run(self, out: trio.MemorySendChannel, acks: trio.MemoryReceiveChannel,
                  stop: trio.Event) -> SnapshotResult:
        """Every routed table into ``out`` (the sink's inbox; closed on return), returning
        once Kafka acknowledged every record (``acks``: the sink's tickets). The stream may
        start unless the result is ``stopped``: the snapshot is done, or every table was
        copied but those ``left`` (rewritten during the copy: the caller has them copied by
        backfill, ``actors.snapshot.backfill.finish_initial``). ``stop`` set (a drain) stops
        the copy: what was read is still delivered, tables whose records are all
        acknowledged are recorded done, and the snapshot stays "started", so the next start
        finishes it by backfill, as after a crash, but without copying twice."""
        cfg, slot_name, slot = self.cfg, self.source.slot, self.slot
        with out:
            try:
                left, done = await copy_tables(cfg, out, acks, self.tables, self.rows, slot,
                                               self.store, stop, self.shapes)
            finally:
                await trio.to_thread.run_sync(self.close)
        result = SnapshotResult(slot.consistent_point, tuple(done), tuple(left or ()),
                                stopped=left is None)
        if result.stopped:
            log.event(_log, "initial snapshot stopped by the drain; the next start finishes "
                      "it by backfill", slot=slot_name)
        elif left:  # stays "started": the backfill records it done
            log.event(_log, "initial snapshot copied; the tables rewritten during it are "
                      "copied by backfill once streaming", slot=slot_name, tables=",".join(left))
        else:
            await self.store.aput(SnapshotState("initial", slot_name, "done"))
            log.event(_log, "initial snapshot done; streaming from the consistent point",
                      slot=slot_name, consistent_point=format_lsn(slot.consistent_point))
        return result


async def interrupted(cfg: Config, client, slot: str) -> list[str]:
    """``["*"]`` when the initial snapshot of ``slot`` was started and not done (to be
    finished by backfill), else none. The slot exists (``InitialSnapshot.wanted`` said no).
    A state topic Kafka did not hold at all (deleted, or a new cluster and a slot made by
    hand) cannot say whether the snapshot finished: it is taken as started and not done, with
    no table done — ``started`` recorded first, so a later start finishes it too."""
    if cfg.snapshot.mode != "initial" or not cfg.source.create_slot:
        return []
    store = StateStore(cfg, client, slot)
    await store.aload()
    if store.created:
        log.event(_log, "the snapshot state topic was missing: whether the initial snapshot "
                  "finished is unknown, so it is finished as a backfill of every routed table "
                  "(rows already in Kafka are written again)", level=WARNING,
                  topic=store.topic, slot=slot)
        await store.aput(SnapshotState("initial", slot, "started", request=uuid.uuid4().hex))
    state = store.get(SnapshotState("initial", slot, ""))
    if state is None or state.state == "done":
        return []
    log.event(_log, "initial snapshot was interrupted; finishing it by backfill", slot=slot)
    return ["*"]
