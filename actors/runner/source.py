"""The source as ``pgrouter run`` starts on it: the server checked, the slot found or
created, and what the pipeline needs to know of both (``ServerInfo``)."""

from __future__ import annotations

import hashlib
import time

import trio

from router.config import Config
from router.errors import ConfigError, LeadershipLost, SlotInUse, SlotMissing, SourceError
from router.exactly_once import Stream
from router.lsn import parse_lsn
from router.publications import Catalog
from router.routing import RouteSpec
from router.server_features import ServerFeatures

from ..services import failover, log
from ..snapshot.exported import copy_name
from ..services.catalog import build_route_specs, load_primary_keys
from ..services.sql import SqlSession

_log = log.get("supervisor")
#: seconds a start waits for another consumer to let go of the slot
SLOT_BUSY_WAIT = 30.0
#: seconds between the lines of a leader still waiting for its slot ([ha])
HELD_LOG = 10.0


class ServerInfo:
    def __init__(self, version: int, db: str, start_lsn: int, proto_version: int,
                 primary_keys: dict[tuple[str, str], tuple[str, ...]] | None = None,
                 created_slot: bool = False):
        self.version = version
        self.db = db
        self.start_lsn = start_lsn
        self.proto_version = proto_version
        self.primary_keys = primary_keys or {}
        self.created_slot = created_slot


def route_specs(cfg: Config, catalog: Catalog | None = None) -> list[RouteSpec]:
    """Route specs from the config; publication routes take their definitions from
    ``catalog`` (``actors.services.catalog``), read at startup and again on SIGHUP."""
    return build_route_specs(cfg, catalog)


def max_proto_version(server_version: int) -> int:
    return ServerFeatures(server_version).max_proto_version


async def identity(sql: SqlSession, slot: str) -> Stream:
    """The stream a slot of this server carries (what exactly-once progress belongs to)."""
    system_id = await sql.fetchval("select system_identifier::text from pg_control_system()")
    db = await sql.fetchval("select current_database()")
    return Stream(system_id=system_id, db=db, slot=slot)


def wal_end_reader(sql: SqlSession):
    """The server's WAL end, read when called from a worker thread of this trio run. The
    exactly-once client reads it *after* the committed progress: a router still committing
    from this server writes no position past the WAL end of the moment it is read (one read
    before could be overtaken by such a commit and taken for another server's progress)."""
    async def read() -> int:
        return parse_lsn(await sql.fetchval(failover.WAL_END))

    return lambda: trio.from_thread.run(read)


async def wait_slot_free(sql: SqlSession, slot: str) -> None:
    """Until no consumer streams ``slot`` and no router copies its initial snapshot (up to
    ``SLOT_BUSY_WAIT``), else ``SlotInUse``. With exactly-once and no [ha] the transactional
    id is registered only after this: a second router on a busy slot waits for it and never
    fences the router streaming it. A slot being copied is not streamed yet (it shows as
    free): the copying router's connection is found by its name (``copy_name``)."""
    deadline = time.monotonic() + SLOT_BUSY_WAIT
    waiting = False
    while True:
        pid = await sql.fetchval(
            "select coalesce((select active_pid from pg_replication_slots where slot_name = $1"
            " and active), (select pid from pg_stat_activity where application_name = $2"
            " limit 1))", slot, copy_name(slot))
        if pid is None:
            return
        if time.monotonic() > deadline:
            raise SlotInUse(f"replication slot {slot!r} is in use by process {pid}; stop "
                            "that consumer first")
        if not waiting:
            waiting = True
            log.event(_log, "waiting for the slot: another consumer streams it", slot=slot,
                      active_pid=pid, wait_s=SLOT_BUSY_WAIT)
        await trio.sleep(0.2)


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

    async def hold(self) -> None:
        """The lock held (kept from the last start if its session is still alive), else
        ``SlotInUse`` after ``SLOT_BUSY_WAIT``."""
        if self.session is not None:
            try:
                await self.session.fetchval("select 1")
                return
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

    async def release(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            with trio.CancelScope(shield=True):
                await session.close()


async def prepare_source(sql: SqlSession, cfg: Config, leading=None) -> ServerInfo:
    """The server and the slot as the pipeline starts on them: the slot found (waiting up
    to ``SLOT_BUSY_WAIT`` for a consumer to let go) or created, and checked. With ``[ha]``
    (``leading``: ``Leadership.holds``) a leader waits as long as it leads: its fence ends the
    previous holder's walsender (``actors.ha.leadership``), and giving up would leave nobody
    streaming."""
    src = cfg.source
    # wal_level, the server's features, the publications and the protocol version were
    # checked by ``preflight.startup_checks`` just before: each check is made once
    version = int(await sql.fetchval("select current_setting('server_version_num')"))
    deadline = time.monotonic() + SLOT_BUSY_WAIT
    said = None  # when the wait was last logged
    created = False
    while True:
        row = await sql.fetch("select plugin, active, active_pid, confirmed_flush_lsn::text as lsn,"
                              " database from pg_replication_slots where slot_name = $1", src.slot)
        if not row:
            if not src.create_slot:
                raise SlotMissing(f"replication slot {src.slot!r} does not exist (set "
                                  "source.create_slot = true to create it)")
            await failover.create_slot(sql, src)
            log.event(_log, "replication slot created", slot=src.slot)
            created = True
            continue
        slot = row[0]
        if slot["plugin"] != "pgoutput":
            raise ConfigError(f"slot {src.slot!r} uses plugin {slot['plugin']}, not pgoutput",
                              path="source.slot")
        db = await sql.fetchval("select current_database()")
        if slot["database"] != db:
            raise ConfigError(f"slot {src.slot!r} belongs to database {slot['database']}, the "
                              f"DSN connects to {db}", path="source.dsn")
        if not slot["active"]:
            await failover.check_slot(sql, src, version)
            break
        if leading is not None:
            said = _still_held(src.slot, slot["active_pid"], leading, said)
        elif time.monotonic() > deadline:
            raise SlotInUse(f"replication slot {src.slot!r} is in use by process "
                            f"{slot['active_pid']}; stop that consumer first")
        await trio.sleep(0.2)  # a standby taking over waits here for its predecessor
    proto = src.proto_version or max_proto_version(version)
    pks = await load_primary_keys(sql)
    return ServerInfo(version, db, parse_lsn(slot["lsn"]) if slot["lsn"] else 0, proto, pks,
                      created)


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
