"""The source as ``pgrouter run`` starts on it (``Source``): its DSN, its slot's name, the
slot found or created, and the server's facts (``ServerInfo``, read anew at each start),
handed to whatever needs the slot — the slot's owner and gate, the initial snapshot, the
pipeline's wiring.

Rules:

* Every look at the slot and every way of making one goes through ``actors.services.slots``
  (the one place that queries ``pg_replication_slots``); ``Source`` is what ``pgrouter run``
  holds of it: the slot's name is read from the config once, by the supervisor.
* ``prepare`` finds the slot (waiting up to ``SLOT_BUSY_WAIT`` for a consumer to let go) or
  creates a plain one; an initial snapshot's slot is created before, exported
  (``export``); verify's is temporary (``actors.verify.point``), never this one.
"""

from __future__ import annotations

import hashlib
import time

import trio

from router.config.router import Config, SourceConfig
from router.errors import ConfigError, LeadershipLost, SlotInUse, SlotMissing, SourceError
from router.delivery.exactly_once import Stream
from router import native
from router.postgres.lsn import format_lsn, parse_lsn
from router.stream.origins import rules_from_config
from router.routing.publications import Catalog
from router.routing.change_router import RouteSpec
from router.postgres.server_features import ServerFeatures

from ..pipeline.slot_monitor import refuse_invalidated, sample_slot
from ..services import failover, log, slots
from ..services.catalog import build_route_specs, load_primary_keys
from ..services.sql import SqlSession

_log = log.get("supervisor")
#: seconds a start waits for another consumer to let go of the slot
SLOT_BUSY_WAIT = 30.0
#: seconds between the lines of a leader still waiting for its slot ([ha])
HELD_LOG = 10.0


class ServerInfo:
    """The server and the slot as one start found them."""

    def __init__(self, version: int, db: str, confirmed_lsn: int, proto_version: int,
                 primary_keys: dict[tuple[str, str], tuple[str, ...]] | None = None,
                 created_slot: bool = False):
        self.version = version
        self.db = db
        self.confirmed_lsn = confirmed_lsn
        self.proto_version = proto_version
        self.primary_keys = primary_keys or {}
        self.created_slot = created_slot


def route_specs(cfg: Config, catalog: Catalog | None = None) -> list[RouteSpec]:
    """Route specs from the config; publication routes take their definitions from
    ``catalog`` (``actors.services.catalog``), read at startup and again on SIGHUP."""
    return build_route_specs(cfg, catalog)


def max_proto_version(server_version: int) -> int:
    return ServerFeatures(server_version).max_proto_version


def wal_end_reader(sql: SqlSession):
    """The server's WAL end, read when called from a worker thread of this trio run. The
    exactly-once client reads it *after* the committed progress: a router still committing
    from this server writes no position past the WAL end of the moment it is read (one read
    before could be overtaken by such a commit and taken for another server's progress)."""
    async def read() -> int:
        return parse_lsn(await sql.fetchval(failover.WAL_END))

    return lambda: trio.from_thread.run(read)


class SlotGate:
    """Exactly-once without [ha]: a session advisory lock on the slot's name, held by the
    router from before it registers the transactional id until it stops. Registering the
    id fences whoever holds it, and a slot shows as free until it is streamed (from a
    start's first queries to ``START_REPLICATION``, and all through an initial snapshot):
    the lock makes the check and the registration one step, so of two routers starting at
    once, or one starting while the other is between its registration and its stream,
    the second waits (``SLOT_BUSY_WAIT``) instead of fencing the first. A killed router's
    session ends and lets go of the lock at once."""

    def __init__(self, dsn: str, slot: str):
        self.dsn, self.slot = dsn, slot
        digest = hashlib.sha1(f"pgrouter slot {slot}".encode()).digest()
        # 63 bits: pg_locks shows it as classid (high 32 bits) and objid (low 32 bits)
        self.key = int.from_bytes(digest[:8], "big") >> 1
        self.session: SqlSession | None = None

    async def hold(self) -> bool:
        """The lock held (kept from the last start if its session is still alive), else
        ``SlotInUse`` after ``SLOT_BUSY_WAIT``: whether it waited for another router."""
        if self.session is not None:
            try:
                await self.session.fetchval("select 1")
                return False
            except SourceError:
                await self.release()
        session = await SqlSession.connect(self.dsn)
        try:
            deadline = time.monotonic() + SLOT_BUSY_WAIT
            waiting = False
            while not await session.fetchval("select pg_try_advisory_lock($1)", self.key):
                pid = await session.fetchval(
                    "select pid from pg_locks where locktype = 'advisory' and granted and "
                    "((classid::bigint << 32) | objid::bigint) = $1 limit 1", self.key)
                if time.monotonic() > deadline:
                    raise SlotInUse(f"replication slot {self.slot!r} is in use by another "
                                    f"router (its PostgreSQL session pid {pid}); stop it first")
                if not waiting:
                    waiting = True
                    log.event(_log, "waiting for the slot: another router holds it",
                              slot=self.slot, pid=pid, wait_s=SLOT_BUSY_WAIT)
                await trio.sleep(0.2)
        except BaseException:
            await session.close()
            raise
        self.session = session
        return waiting

    async def release(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            with trio.CancelScope(shield=True):
                await session.close()


class Source:
    """The source of one start: its DSN and slot (from ``[source]``, read once here), the
    slot's queries and creation (``actors.services.slots``), and the server's facts once
    ``prepare`` found the slot at a start (``server``). Made once by the supervisor, handed
    down to the initial snapshot and the pipeline's wiring."""

    def __init__(self, config: SourceConfig):
        self.config = config
        self.dsn = config.dsn
        self.slot = config.slot
        self._server: ServerInfo | None = None

    @property
    def server(self) -> ServerInfo:
        """The server's facts as ``prepare`` found them at this start."""
        if self._server is None:
            raise RuntimeError("the source is not prepared yet (Source.prepare)")
        return self._server

    async def exists(self, sql: SqlSession) -> bool:
        return await slots.exists(sql, self.slot)

    async def identity(self, sql: SqlSession) -> Stream:
        """The stream the slot of this server carries (what exactly-once progress belongs
        to)."""
        system_id = await sql.fetchval("select system_identifier::text from pg_control_system()")
        db = await sql.fetchval("select current_database()")
        return Stream(system_id=system_id, db=db, slot=self.slot)

    async def wait_free(self, sql: SqlSession) -> bool:
        """Until no consumer streams the slot and no router copies its initial snapshot (up
        to ``SLOT_BUSY_WAIT``), else ``SlotInUse``; asked by every start without [ha], in
        both delivery modes. With exactly-once the transactional id is registered only after
        this: a second router on a busy slot waits for it and never fences the router
        streaming it. A slot being copied is not streamed yet (it shows as free): the
        copying router's connection is found by its name (``slots.copy_name``); at-least-once
        a second router would otherwise stream beside the copy and finish it by backfill.
        Whether it waited."""
        deadline = time.monotonic() + SLOT_BUSY_WAIT
        waiting = False
        while (pid := await slots.busy_pid(sql, self.slot)) is not None:
            if time.monotonic() > deadline:
                raise SlotInUse(f"replication slot {self.slot!r} is in use by process {pid}; "
                                "stop that consumer first")
            if not waiting:
                waiting = True
                log.event(_log, "waiting for the slot: another consumer streams it",
                          slot=self.slot, active_pid=pid, wait_s=SLOT_BUSY_WAIT)
            await trio.sleep(0.2)
        return waiting

    def export(self) -> slots.ExportedSlot:
        """The slot created with an exported snapshot, for the initial snapshot (blocking: a
        worker thread's)."""
        src = self.config
        return slots.ExportedSlot(self.dsn, self.slot, src.two_phase, src.failover)

    async def prepare(self, sql: SqlSession, leading=None) -> ServerInfo:
        """The server and the slot as the pipeline starts on them (``server``): the slot
        found (waiting up to ``SLOT_BUSY_WAIT`` for a consumer to let go) or created, and
        checked. With ``[ha]`` (``leading``: ``Leadership.holds``) a leader waits as long as
        it leads: its fence ends the previous holder's walsender (``actors.ha.leadership``),
        and giving up would leave nobody streaming."""
        src = self.config
        # wal_level, the server's features, the publications and the protocol version were
        # checked by ``preflight.startup_checks`` just before: each check is made once
        version = int(await sql.fetchval("select current_setting('server_version_num')"))
        db = await sql.fetchval("select current_database()")
        slot, created = await self._found(sql, version, db, leading)
        proto = src.proto_version or max_proto_version(version)
        pks = await load_primary_keys(sql)
        self._server = ServerInfo(version, db, parse_lsn(slot["lsn"]) if slot["lsn"] else 0,
                                  proto, pks, created)
        return self._server

    async def refuse_invalidated(self, sql: SqlSession) -> None:
        """``SlotInvalidated`` when the server invalidated the slot (``wal_status`` lost)."""
        refuse_invalidated(self.slot, await sample_slot(sql, self.slot))

    def log_starting(self, cfg: Config, until_lsn: int | None) -> None:
        """The "starting" line: the source, its slot and server, what this run does."""
        info = self.server
        log.event(_log, "starting", dsn=self.dsn, slot=self.slot, db=info.db,
                  server_version=info.version, proto_version=info.proto_version,
                  origin_filter=rules_from_config(cfg).filtering_at(info.version),
                  confirmed_lsn=format_lsn(info.confirmed_lsn),
                  until_lsn=format_lsn(until_lsn) if until_lsn is not None else None,
                  hot_path=native.describe(), kafka_client=cfg.kafka.client)

    async def _found(self, sql: SqlSession, version: int, db: str, leading):
        """The slot's row once it is free (created when missing and the config says so), and
        whether this start created it."""
        src, name = self.config, self.slot
        deadline = time.monotonic() + SLOT_BUSY_WAIT
        said = None  # when the wait was last logged
        created = False
        while True:
            slot = await slots.row(sql, name)
            if slot is None:
                if not src.create_slot:
                    raise SlotMissing(f"replication slot {name!r} does not exist (set "
                                      "source.create_slot = true to create it)")
                await slots.create(sql, name, src.two_phase, src.failover)
                log.event(_log, "replication slot created", slot=name)
                created = True
                continue
            if slot["plugin"] != "pgoutput":
                raise ConfigError(f"slot {name!r} uses plugin {slot['plugin']}, not pgoutput",
                                  path="source.slot")
            if slot["database"] != db:
                raise ConfigError(f"slot {name!r} belongs to database {slot['database']}, the "
                                  f"DSN connects to {db}", path="source.dsn")
            if not slot["active"]:
                await failover.check_slot(sql, name, src.failover)
                return slot, created
            if leading is not None:
                said = _still_held(name, slot["active_pid"], leading, said)
            elif time.monotonic() > deadline:
                raise SlotInUse(f"replication slot {name!r} is in use by process "
                                f"{slot['active_pid']}; stop that consumer first")
            await trio.sleep(0.2)  # a standby taking over waits here for its predecessor


def _still_held(slot: str, pid: int, leading, said: float | None) -> float:
    """A leader's wait for a busy slot: it ends only with leadership (``LeadershipLost``);
    logged every ``HELD_LOG`` seconds."""
    if not leading():
        raise LeadershipLost("leadership lost while waiting for the slot")
    now = time.monotonic()
    if said is None or now - said >= HELD_LOG:
        log.event(_log, "leading, waiting for the slot: the previous holder's walsender "
                  "still has it", slot=slot, active_pid=pid)
        return now
    return said
