"""Standbys and failover: what the router checks about the server its DSN reaches.

Rules:

* Reading from a standby needs PostgreSQL 16+ (logical decoding in recovery); on 15 the
  router says so instead of failing inside the walsender. A slot created on a standby waits
  for the primary's next running-transactions record (``pg_log_standby_snapshot()`` on the
  primary writes one at once; otherwise within ~15 s).
* ``source.failover = true`` creates the slot with ``failover = true`` (17+), so a standby
  with ``sync_replication_slots = on`` keeps a copy of it. An existing slot without failover
  is refused: it would silently not survive a promotion.
* With a multi-host DSN (``host=a,b target_session_attrs=read-write``, or
  ``postgresql://a:5432,b:5432/db?target_session_attrs=read-write``) each reconnection
  reaches whichever server is the primary now. Once the router has confirmed a position,
  the server it reaches must hold the slot (a missing slot is refused even with
  ``create_slot = true``: a new slot would start after changes nobody sent) and its WAL must
  reach that position (a server whose WAL ends before it never had changes Kafka already
  holds: refused). A synchronised slot behind the confirmed position only sends again
  transactions already in Kafka, at their delivered positions.
"""

from __future__ import annotations

from router.config.router import SourceConfig
from router.errors import ConfigError, SlotBehind, SlotMissing
from router.postgres.lsn import format_lsn, parse_lsn
from router.postgres.server_features import ServerFeatures

from . import slots
from .sql import SqlSession

FAILOVER = "failover slots (synchronised to a standby)"
STANDBY = "logical decoding on a standby"

#: the server's WAL end: written on a primary, replayed on a standby
WAL_END = ("select (case when pg_is_in_recovery() then pg_last_wal_replay_lsn() "
           "else pg_current_wal_lsn() end)::text")


async def check_server(sql: SqlSession, src: SourceConfig, version: int) -> bool:
    """Version checks for standbys and failover slots; returns whether the server is a
    standby."""
    features = ServerFeatures(version)
    in_recovery = bool(await sql.fetchval("select pg_is_in_recovery()"))
    if in_recovery and not features.standby_decoding:
        raise ConfigError(features.lacks(STANDBY) + " (source.dsn reaches a standby)",
                          path="source.dsn")
    if src.failover and not features.failover_slots:
        raise ConfigError(features.lacks(FAILOVER), path="source.failover")
    return in_recovery


async def check_slot(sql: SqlSession, slot: str, wanted: bool) -> None:
    """An existing slot must have ``failover`` when the config asks for it (``wanted``:
    ``source.failover``)."""
    if not wanted:
        return
    if await slots.has_failover(sql, slot) is False:
        raise ConfigError(f"replication slot {slot!r} was created without failover; it "
                          "would not survive a promotion of the standby (drop and recreate it, "
                          "or set source.failover = false)", path="source.failover")


async def check_resume(sql: SqlSession, slot: str, confirmed: int | None) -> None:
    """Before streaming again after a failure: the server reached now (perhaps a promoted
    standby) must continue where the router stopped. ``confirmed``: the position the router
    confirmed before (None on the first connection)."""
    if confirmed is None:
        return
    where = await sql.fetchval("select coalesce(inet_server_addr()::text, 'socket') || ':' || "
                               "current_setting('port')")
    if not await slots.exists(sql, slot):
        raise SlotMissing(f"replication slot {slot!r} is missing on {where}, the server the "
                          f"DSN reaches now (was it a standby without the synchronised slot? "
                          f"source.failover = true and sync_replication_slots = on keep it); "
                          f"the router confirmed {format_lsn(confirmed)} and will not create "
                          "a new slot that starts later")
    end = parse_lsn(await sql.fetchval(WAL_END))
    if end < confirmed:
        raise SlotBehind(f"{where}, the server the DSN reaches now, has WAL only up to "
                         f"{format_lsn(end)} but the router already confirmed "
                         f"{format_lsn(confirmed)}: Kafka holds changes this server never had "
                         "(a standby behind its primary; synchronized_standby_slots on the "
                         "primary prevents it)")
