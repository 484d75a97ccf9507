"""The applier's session on the target: its replication origin, its progress table and the
catalog of the tables it writes.

Rules:

* The session is bound to the origin with ``pg_replication_origin_session_setup`` (the
  origin is created when missing), so every transaction it commits carries the origin and
  the target's router sees the Origin message.
* The origin's progress moves only with a committed transaction. PostgreSQL advances the
  session's origin to the LSN given to ``pg_replication_origin_xact_setup`` at the end of
  the transaction, also when it aborts (its abort record carries the origin too). So the
  setup is the last statement before COMMIT, after every change, the progress row and
  ``set constraints all immediate`` (when the target has deferrable constraints), or is
  folded into the last change's statement and evaluated after it (``with_origin``): a
  change that fails never reaches it. Only COMMIT itself can fail after it (a deferrable
  constraint added while applying, a commit-time hook): the writer then puts the origin
  back (``rewind_origin``).
* The progress table (``target.progress_table``, one row per origin) holds the Kafka
  offsets a restart reads from, written in the same transaction as the changes it covers.
  It is a seek hint, the origin is the truth: a row ahead of the origin's progress (the
  origin was dropped and made again) is ignored and the topics are read from the beginning.
* The session plans without hash and merge joins (``PLANNER``): the statements join their
  rows to a table on its key, whose index every target table has (its primary key or
  replica identity), so each row is found by one index lookup, never by reading the table.
* ``synchronous_commit`` is the configured one ("off" by default, like PostgreSQL's apply
  worker): what a crash of the target loses, it loses with its origin progress and its
  offsets, so it is applied again.
"""

from __future__ import annotations

import json
import logging
import time

import asyncpg
import trio

from router.config.applier import ApplyTarget
from router.apply.batches import literal
from router.errors import ApplyError
from router.postgres.identifiers import split_qualified
from router.postgres.lsn import format_lsn, parse_lsn
from router.apply.statements import TargetTable, quote_ident

from ..services import log
from ..services.sql import SqlSession

_log = log.get("applier")
ORIGIN_BUSY_WAIT = 30.0
#: the session's plans: a set-based statement joins its rows to the table by key, one index
#: lookup a row, as the apply worker finds each row (measured on a 200,000-row table: a
#: 1,000-row UPDATE … FROM (VALUES …) hash-joined a sequential scan of the table, 33-39 µs
#: of the server's CPU a row, against 9-11 µs by the key's index)
PLANNER = "set enable_hashjoin = off; set enable_mergejoin = off"


def progress_table_sql(cfg: ApplyTarget) -> str:
    schema, name = split_qualified(cfg.progress_table, schema_needed=True)
    return f"{quote_ident(schema)}.{quote_ident(name)}"


def progress_statement(cfg: ApplyTarget, commit_lsn: int, resume: dict[str, int]) -> str:
    """Upsert of this origin's row: the offsets to restart from after ``commit_lsn``."""
    return (f"insert into {progress_table_sql(cfg)} (origin, commit_lsn, offsets) values "
            f"({literal(cfg.origin)}, {literal(format_lsn(commit_lsn))}, "
            f"{literal(json.dumps(resume, sort_keys=True))}) on conflict (origin) do update "
            "set commit_lsn = excluded.commit_lsn, offsets = excluded.offsets, "
            "updated_at = now()")


async def setup_session(sql: SqlSession, cfg: ApplyTarget) -> tuple[int, dict[str, int] | None]:
    """Bind the session to the origin; return its durable progress (the source commit LSN
    of the last transaction applied) and the stored restart offsets (None: read from the
    beginning)."""
    origin = cfg.origin
    await sql.execute(f"set synchronous_commit = {cfg.synchronous_commit}; "
                      "set standard_conforming_strings = on; " + PLANNER)
    if await sql.fetchval("select pg_replication_origin_oid($1)", origin) is None:
        try:
            await sql.fetchval("select pg_replication_origin_create($1)", origin)
            log.event(_log, "replication origin created", origin=origin)
        except asyncpg.UniqueViolationError:
            pass  # created concurrently
        except asyncpg.InsufficientPrivilegeError as exc:
            raise ApplyError(f"the target user may not use replication origins: {exc}") from exc
    deadline = time.monotonic() + ORIGIN_BUSY_WAIT
    while True:
        try:
            await sql.fetchval("select pg_replication_origin_session_setup($1)", origin)
            break
        except asyncpg.ObjectInUseError as exc:
            # the backend of a killed predecessor may still hold it for a moment
            if time.monotonic() > deadline:
                raise ApplyError(f"replication origin {origin!r} is in use by another "
                                 f"session: {exc}") from exc
            await trio.sleep(0.5)
        except asyncpg.InsufficientPrivilegeError as exc:
            raise ApplyError(f"the target user may not use replication origins: {exc}") from exc
    progress = await sql.fetchval("select pg_replication_origin_progress($1, true)::text", origin)
    applied = parse_lsn(progress) if progress else 0
    table = progress_table_sql(cfg)
    try:
        await sql.execute(f"create table if not exists {table} (origin text primary key, "
                          "commit_lsn pg_lsn not null, offsets jsonb not null, "
                          "updated_at timestamptz not null default now())")
    except asyncpg.UniqueViolationError:
        pass  # created concurrently by another applier
    except asyncpg.PostgresError as exc:
        raise ApplyError(f"cannot create the progress table {cfg.progress_table}: {exc}") from exc
    row = await sql.fetch(f"select commit_lsn::text, offsets::text from {table} "
                          "where origin = $1", origin)
    if not row:
        return applied, None
    stored = parse_lsn(row[0][0])
    if stored > applied:
        log.event(_log, "progress table ahead of the replication origin: reading the topics "
                  "from the beginning", stored=format_lsn(stored), origin_progress=progress)
        return applied, None
    return applied, json.loads(row[0][1])


async def has_deferrable_checks(sql: SqlSession) -> bool:
    """Whether the target has deferrable constraints or constraint triggers (all are
    triggers in ``pg_trigger``): their checks may wait for COMMIT unless forced earlier."""
    return bool(await sql.fetchval("select exists (select 1 from pg_trigger where "
                                   "tgdeferrable)"))


async def rewind_origin(sql: SqlSession, origin: str, lsn: int) -> None:
    """Put the origin's progress back to ``lsn`` after a COMMIT failed past its
    ``pg_replication_origin_xact_setup``: ``pg_replication_origin_advance`` refuses an origin
    a session holds (ours too), so the session lets go of it and takes it again."""
    await sql.execute("select pg_replication_origin_session_reset()")
    await sql.fetchval("select pg_replication_origin_advance($1, $2::text::pg_lsn)", origin,
                       format_lsn(lsn))
    await sql.fetchval("select pg_replication_origin_session_setup($1)", origin)
    # the failed transaction's LSN stays the session's until the next setup: a commit
    # without one (snapshot rows) would move the origin there again
    await sql.execute("select pg_replication_origin_xact_reset()")
    log.event(_log, "replication origin put back after a failed commit", origin=origin,
              origin_progress=format_lsn(lsn), level=logging.WARNING)


async def session_progress(sql: SqlSession) -> int:
    """The source commit LSN of the last transaction this session committed."""
    value = await sql.fetchval("select pg_replication_origin_session_progress(false)::text")
    return parse_lsn(value) if value else 0


async def load_table(sql: SqlSession, t_schema: str, t_name: str) -> TargetTable:
    qname = quote_ident(t_schema) + "." + quote_ident(t_name)
    try:
        rows = await sql.fetch(
            # the type without its modifier: an explicit cast to varchar(2) or bit(3)
            # truncates, while the column's own assignment rejects what does not fit, as
            # the type's input function does for PostgreSQL's apply worker (format_type
            # with -1 writes bpchar and "bit", not character(1) and bit(1))
            "select a.attname, format_type(a.atttypid, -1) as type, "
            "coalesce(nullif(t.typbasetype, 0), a.atttypid) in ('json'::regtype, "
            "'jsonb'::regtype) as is_json from pg_attribute a join pg_type t on "
            "t.oid = a.atttypid where a.attrelid = $1::text::regclass and a.attnum > 0 "
            "and not a.attisdropped order by a.attnum", qname)
        keys = await sql.fetch(
            "select i.indisprimary, array(select a.attname from unnest(i.indkey) with "
            "ordinality k(n, o) join pg_attribute a on a.attrelid = i.indrelid and "
            "a.attnum = k.n order by k.o) as cols from pg_index i where i.indrelid = "
            "$1::text::regclass and (i.indisprimary or i.indisreplident) "
            "order by i.indisprimary desc", qname)
        plain = await sql.fetchval(
            "select c.relkind <> 'p' and not c.relhastriggers and not c.relhasrules from "
            "pg_class c where c.oid = $1::text::regclass", qname)
    except asyncpg.UndefinedTableError as exc:
        raise ApplyError(f"target table {t_schema}.{t_name} does not exist") from exc
    key = tuple(keys[0]["cols"]) if keys else ()
    return TargetTable(t_schema, t_name, {r["attname"]: r["type"] for r in rows}, key,
                       frozenset(r["attname"] for r in rows if r["is_json"]), plain=bool(plain))
