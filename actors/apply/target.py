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
  back (``rewind_origin``). A client that dies between the setup and COMMIT (killed, its
  connection lost) leaves the backend to abort the transaction with the origin moved
  past it: the progress row says where the target is.
* The progress table (``target.progress_table``, one row per origin) holds the source
  commit LSN of the last transaction committed and the Kafka offsets a restart reads from:
  every target transaction with an origin setup upserts it (in the setup's statement), so
  it commits with the changes it covers or not at all; the offsets are rewritten when the
  transaction carries them, kept otherwise (a seek hint: reading from older ones skips
  what is applied). At start, an origin ahead of the row is put back to the row's LSN (an
  aborted transaction moved it); a row ahead of the origin's progress (the origin was
  dropped and made again) is ignored and the topics are read from the beginning.
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


def progress_upsert(cfg: ApplyTarget, lsn: str, offsets: str) -> str:
    """Upsert of this origin's row to ``lsn`` and the restart ``offsets`` (SQL expressions
    of text; offsets NULL: the row keeps its own), ``returning 1``."""
    return (f"insert into {progress_table_sql(cfg)} as p (origin, commit_lsn, offsets) values "
            f"({literal(cfg.origin)}, {lsn}::pg_lsn, coalesce({offsets}::jsonb, '{{}}')) "
            "on conflict (origin) do update set commit_lsn = excluded.commit_lsn, "
            f"offsets = coalesce({offsets}::jsonb, p.offsets), updated_at = now() returning 1")


def offsets_json(resume: dict[str, int] | None) -> str | None:
    return None if resume is None else json.dumps(resume, sort_keys=True)


def progress_statement(cfg: ApplyTarget, commit_lsn: int, resume: dict[str, int] | None) -> str:
    """The progress row's upsert: the offsets to restart from after ``commit_lsn``."""
    return progress_upsert(cfg, literal(format_lsn(commit_lsn)), literal(offsets_json(resume)))


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
    if stored < applied:
        # a transaction aborted after its origin setup (its client gone before COMMIT)
        await rewind_origin(sql, origin, stored, "to the progress table's")
        applied = stored
    return applied, json.loads(row[0][1]) or None


async def has_deferrable_checks(sql: SqlSession) -> bool:
    """Whether the target has deferrable constraints or constraint triggers (all are
    triggers in ``pg_trigger``): their checks may wait for COMMIT unless forced earlier."""
    return bool(await sql.fetchval("select exists (select 1 from pg_trigger where "
                                   "tgdeferrable)"))


async def rewind_origin(sql: SqlSession, origin: str, lsn: int,
                        why: str = "after a failed commit") -> None:
    """Put the origin's progress back to ``lsn`` after a transaction ended past its
    ``pg_replication_origin_xact_setup`` without committing: ``pg_replication_origin_advance``
    refuses an origin a session holds (ours too), so the session lets go of it and takes it
    again."""
    await sql.execute("select pg_replication_origin_session_reset()")
    await sql.fetchval("select pg_replication_origin_advance($1, $2::text::pg_lsn)", origin,
                       format_lsn(lsn))
    await sql.fetchval("select pg_replication_origin_session_setup($1)", origin)
    # the failed transaction's LSN stays the session's until the next setup: a commit
    # without one (snapshot rows) would move the origin there again
    await sql.execute("select pg_replication_origin_xact_reset()")
    log.event(_log, f"replication origin put back {why}", origin=origin,
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
