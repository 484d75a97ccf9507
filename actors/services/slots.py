"""The replication slot in SQL: every query of ``pg_replication_slots`` the router makes and
every way it creates a slot, in one place. ``pgrouter run`` reaches them through its
``Source`` (``actors.runner.source``); ``status``, ``check``, ``setup``, ``verify``, the slot
monitor and owner, ``[ha]`` fencing and the backfill request call them directly.

Rules:

* Three ways to create a slot, all ``pgoutput``:
  - plain (``create``): SQL ``pg_create_logical_replication_slot``, with two-phase and, on
    PostgreSQL 17+, ``failover`` as the config asks;
  - exported (``ExportedSlot``): on a replication connection with ``SNAPSHOT 'export'``, for
    the initial snapshot: its consistent point and the exported snapshot describe the same
    instant — every transaction committed before it is in the snapshot, every later one is
    streamed. That connection stays open (and idle) until every reader imported the
    snapshot and finished (``close``): the snapshot lives as long as the connection;
  - temporary and exported (``export_slot(..., temporary=True)``), for ``pgrouter verify``:
    closing the connection drops it, so verify never holds WAL back beyond its snapshot.
* The exporting connection of an initial snapshot is named (``application_name``,
  ``copy_name``): the slot shows as free until the copy is in Kafka and the stream starts,
  and a second router on the same config must see that the first is still copying
  (``busy_pid``) rather than register the transactional id, which fences the copy.
* A slot of that name created by someone else is ``SlotInUse``; a server that cannot be
  reached is ``SourceUnavailable``; any other refusal is ``SourceError`` (one line each).
* Not here, as they read the definitions log in the same statement: the definitions
  trigger's own cleanup (PL/pgSQL, run inside PostgreSQL) and
  ``publication_trigger.changes_since`` read the slots' ``restart_lsn`` there.
"""

from __future__ import annotations

import hashlib

import psycopg2
import psycopg2.errors
import psycopg2.extras

from router.errors import SlotInUse, SourceError, SourceUnavailable
from router.postgres.lsn import parse_lsn

from .sql import SqlSession

#: the slot as a start checks it, ``status`` shows it and verify waits on it
_ROW = ("select plugin, active, active_pid, confirmed_flush_lsn::text as lsn, database "
        "from pg_replication_slots where slot_name = $1")

#: the slot monitor's sample: the server's position beside the slot's
_SAMPLE = """
select (case when pg_is_in_recovery() then pg_last_wal_replay_lsn()
             else pg_current_wal_lsn() end)::text as current,
       confirmed_flush_lsn::text as confirmed, restart_lsn::text as restart,
       wal_status, safe_wal_size, active
from pg_replication_slots where slot_name = $1
"""

#: route publications whose catalog rows were written by a transaction the slot may still
#: have to decode (newer than its ``catalog_xmin``): changed within the backlog, perhaps
_CHANGED_IN_BACKLOG = """
select p.pubname from pg_publication p, pg_replication_slots s
where s.slot_name = $1 and p.pubname = any($2::text[]) and s.catalog_xmin is not null
  and (age(p.xmin) <= age(s.catalog_xmin)
       or exists (select from pg_publication_rel r where r.prpubid = p.oid
                  and age(r.xmin) <= age(s.catalog_xmin)))
order by 1
"""


async def row(sql: SqlSession, slot: str):
    """The slot's plugin, active, active_pid, lsn (confirmed_flush_lsn as text) and
    database, or None when it does not exist."""
    rows = await sql.fetch(_ROW, slot)
    return rows[0] if rows else None


async def sample(sql: SqlSession, slot: str):
    """The server's position (``current``) beside the slot's ``confirmed``, ``restart``,
    ``wal_status``, ``safe_wal_size`` and ``active``, or None when it does not exist."""
    rows = await sql.fetch(_SAMPLE, slot)
    return rows[0] if rows else None


async def exists(sql: SqlSession, slot: str) -> bool:
    return bool(await sql.fetchval(
        "select exists (select 1 from pg_replication_slots where slot_name = $1)", slot))


async def active_pid(sql: SqlSession, slot: str) -> int | None:
    return await sql.fetchval("select active_pid from pg_replication_slots "
                              "where slot_name = $1", slot)


async def busy_pid(sql: SqlSession, slot: str) -> int | None:
    """The process streaming ``slot``, else the one exporting its initial snapshot
    (``copy_name``), else None."""
    return await sql.fetchval(
        "select coalesce((select active_pid from pg_replication_slots where slot_name = $1"
        " and active), (select pid from pg_stat_activity where application_name = $2"
        " limit 1))", slot, copy_name(slot))


async def terminate(sql: SqlSession, slot: str, pid: int) -> bool:
    """``pg_terminate_backend`` of ``pid`` if it still holds ``slot``: whether it did."""
    return bool(await sql.fetchval("select pg_terminate_backend(active_pid) from "
                                   "pg_replication_slots where slot_name = $1 and "
                                   "active_pid = $2", slot, pid))


async def has_failover(sql: SqlSession, slot: str) -> bool | None:
    """The slot's ``failover`` flag (PostgreSQL 17+); None when the slot does not exist."""
    return await sql.fetchval("select failover from pg_replication_slots where "
                              "slot_name = $1", slot)


async def changed_in_backlog(sql: SqlSession, slot: str, publications: list[str]) -> list:
    """The publications of ``publications`` changed by a transaction the slot may still
    have to decode (rows with ``pubname``)."""
    return await sql.fetch(_CHANGED_IN_BACKLOG, slot, publications)


async def create(sql: SqlSession, slot: str, two_phase: bool, failover: bool = False) -> None:
    """A plain ``pgoutput`` slot (``failover``: PostgreSQL 17+)."""
    if failover:
        await sql.fetch("select pg_create_logical_replication_slot($1, 'pgoutput', false, $2, "
                        "true)", slot, two_phase)
    else:
        await sql.fetch("select pg_create_logical_replication_slot($1, 'pgoutput', false, $2)",
                        slot, two_phase)


async def drop_when_inactive(sql: SqlSession, slot: str, wait) -> None:
    """Drop ``slot`` once no walsender holds it (``wait``: an async sleep between looks)."""
    while await sql.fetchval("select active from pg_replication_slots where slot_name = $1",
                             slot):
        await wait()
    await sql.execute("select pg_drop_replication_slot(slot_name) from pg_replication_slots "
                      "where slot_name = $1", slot)


def copy_name(slot: str) -> str:
    """The ``application_name`` of the connection exporting ``slot``'s initial snapshot:
    at most 63 bytes (PostgreSQL cuts longer ones), a long slot name ending in a hash."""
    name = f"pgrouter snapshot {slot}"
    if len(name.encode()) <= 63:
        return name
    digest = hashlib.sha1(slot.encode()).hexdigest()[:16]
    return f"pgrouter snapshot {slot.encode()[:28].decode(errors='ignore')}~{digest}"


def export_slot(dsn: str, slot: str, options: str = "", temporary: bool = False,
                application_name: str | None = None):
    """Opens a replication connection and creates the logical slot ``slot`` on it with
    ``SNAPSHOT 'export'`` (``options``: more, e.g. ``", TWO_PHASE"``): (connection, consistent
    point, snapshot name). The snapshot lives as long as the connection. psycopg2's errors
    pass through: each caller says in its own words what failed."""
    extra = {"application_name": application_name} if application_name else {}
    conn = psycopg2.connect(
        dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection, **extra)
    try:
        cur = conn.cursor()
        cur.execute(f'CREATE_REPLICATION_SLOT "{slot.replace(chr(34), "")}"'
                    f"{' TEMPORARY' if temporary else ''} LOGICAL pgoutput "
                    f"(SNAPSHOT 'export'{options})")
        row = cur.fetchone()
    except BaseException:
        conn.close()
        raise
    return conn, parse_lsn(row[1]), row[2]


class ExportedSlot:
    """A slot created with an exported snapshot, on a replication connection kept open
    (blocking: a worker thread's)."""

    def __init__(self, dsn: str, slot: str, two_phase: bool, failover: bool = False):
        self.dsn, self.name = dsn, slot
        opts = ((", TWO_PHASE" if two_phase else "")
                + (", FAILOVER" if failover else ""))  # source.failover, 17+
        try:
            self.conn, self.consistent_point, self.snapshot = export_slot(
                dsn, slot, opts, application_name=copy_name(slot))
        except psycopg2.errors.DuplicateObject as exc:
            raise SlotInUse(f"replication slot {slot!r} was created by someone else: "
                            f"{exc}".strip()) from exc
        except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
            raise SourceUnavailable(f"cannot create slot {slot!r}: {exc}".strip()) from exc
        except psycopg2.Error as exc:
            raise SourceError(f"cannot create slot {slot!r}: {exc}".strip()) from exc

    def close(self) -> None:
        try:
            self.conn.close()
        except psycopg2.Error:
            pass
