"""The applier's slow path: one source transaction applied change by change, under the
conflict policy (``target.conflict``), when its set-based statements failed
(``actors.apply.writer``).

Rules:

* Conflicts are named as PostgreSQL 18's apply worker names them: ``insert_exists`` (an
  insert, or an update's new row, clashing with a row on any unique or exclusion
  constraint, the key or another column), ``update_exists`` (an update clashing so),
  ``update_missing``, ``delete_missing``. ``error`` stops at the first with
  ``ApplyConflict``; ``skip`` and ``upsert`` count it, log it with its key and go on.
* Under ``skip`` and ``upsert`` each insert and update runs in a savepoint, so a clash
  rolls back that change alone and never takes other rows with it. ``upsert`` writes the
  incoming row over the row with its key (last writer wins); a clash with another row on a
  non-key column is skipped like under ``skip``: writing it would delete a row of another
  key.
* Snapshot rows (``op: "r"``) are upserts under every policy.
* Any other error (a type, a constraint, a trigger…) is an ``ApplyError`` of one line
  naming the table, key and transaction: the transaction is rolled back.
* The progress row and the origin setup are the last statement before COMMIT
  (``actors.apply.target``); a COMMIT that fails after it puts the origin back.
"""

from __future__ import annotations

import logging

import asyncpg
import trio

from router.config.applier import ApplyConfig
from router.apply.batches import literal
from router.errors import ApplyConflict, ApplyError, SourceUnavailable
from router.postgres.lsn import format_lsn
from router.apply.reassembly import SourceTransaction
from router.apply.statements import TargetTable, affected, key_of

from ..services import log
from ..services.sql import SqlSession
from .target import offsets_json, progress_statement, progress_upsert, rewind_origin

_log = log.get("applier")


def connection_lost(exc: BaseException) -> bool:
    return isinstance(exc, (asyncpg.PostgresConnectionError, asyncpg.AdminShutdownError,
                            asyncpg.CannotConnectNowError, asyncpg.InterfaceError,
                            ConnectionError))


async def rollback(sql: SqlSession) -> None:
    with trio.move_on_after(5) as scope:
        scope.shield = True
        try:
            await sql.execute("rollback")
        except Exception:  # the connection is gone: the server rolled back
            pass


class ChangeByChange:
    def __init__(self, sql: SqlSession, cfg: ApplyConfig, stats,
                 tables: dict[tuple[str, str], TargetTable]):
        self.sql = sql
        self.cfg = cfg
        self.conflict = cfg.target.conflict
        self.stats = stats
        self._tables = tables
        self._savepoint = False  # a row savepoint is open
        self._clash = ""  # the last clash a savepoint caught

    async def apply(self, txn: SourceTransaction, progress_lsn: int,
                    deferrable: bool | None) -> None:
        """``txn`` in one target transaction, change by change; ``progress_lsn``: the
        origin's progress before it (where a failed COMMIT puts the origin back)."""
        sql = self.sql
        self._savepoint = False
        await sql.execute("begin")
        try:
            for topic, rec in txn.records:
                await self._change(txn, rec)
            tail = "set constraints all immediate;" if deferrable else ""
            if txn.snapshot:  # the origin stays where it is
                if txn.resume is not None:
                    tail += progress_statement(self.cfg.target, progress_lsn, txn.resume) + ";"
            else:  # the progress row, then the origin setup (``actors.apply.target``)
                lsn = literal(format_lsn(txn.commit_lsn))
                row = progress_upsert(self.cfg.target, lsn, literal(offsets_json(txn.resume)))
                tail += (f"with _p as ({row}) select pg_replication_origin_xact_setup({lsn}, "
                         f"{literal(txn.commit_time)}) from _p;")
            try:
                await sql.execute(tail + "commit")
            except asyncpg.PostgresError as exc:
                if connection_lost(exc):
                    raise SourceUnavailable(f"target connection lost: {exc}") from exc
                if not sql.in_transaction:  # COMMIT failed, after the origin setup
                    await rewind_origin(sql, self.cfg.target.origin, progress_lsn)
                raise ApplyError(f"committing transaction {txn.id} on the target failed: "
                                 f"{_reason(exc)}") from exc
        except BaseException:
            await rollback(sql)
            raise

    def _conflict(self, kind: str, txn: SourceTransaction, table: TargetTable, key: dict,
                  reason: str = ""):
        if self.conflict == "error":
            raise ApplyConflict(f"{kind} on {table.schema}.{table.name} key {key} "
                                f"(transaction {txn.id}){': ' + reason if reason else ''}; "
                                "set target.conflict = skip or upsert to go on")
        self.stats.conflicts[kind] = self.stats.conflicts.get(kind, 0) + 1
        fields = {"reason": reason} if reason else {}
        log.event(_log, "conflict", level=logging.WARNING, kind=kind, policy=self.conflict,
                  table=f"{table.schema}.{table.name}", key=key, transaction=txn.id, **fields)

    async def _guarded(self, method, query: str, args: list):
        """``method(query, *args)`` in a savepoint (not under ``error``: the first clash
        stops); None when it hit a unique or exclusion constraint, rolled back alone."""
        if self.conflict == "error":
            return await method(query, *args)
        await self.sql.execute("release savepoint pgr_row; savepoint pgr_row"
                               if self._savepoint else "savepoint pgr_row")
        self._savepoint = True
        try:
            return await method(query, *args)
        except (asyncpg.UniqueViolationError, asyncpg.ExclusionViolationError) as exc:
            await self.sql.execute("rollback to savepoint pgr_row")
            self._clash = _reason(exc)
            return None

    async def _change(self, txn: SourceTransaction, rec) -> None:
        op = rec.op
        if op == "m":
            return
        src = rec.source
        table = self._tables[(src.schema, src.table)]
        sql = self.sql
        try:
            if op in ("c", "r"):
                # snapshot rows hold the row as of their position: an upsert, whatever the
                # policy says about changes
                policy = "upsert" if op == "r" else self.conflict
                query, args = table.insert(rec.after, policy)
                if policy == "error":
                    await sql.execute(query, *args)
                    return
                rows = await self._guarded(sql.fetch, query, args)
                if rows is None:
                    self._conflict("insert_exists", txn, table, key_of(table, None, rec.after),
                                   self._clash)
                elif op == "c" and (not rows or rows[0][0] is False):
                    self._conflict("insert_exists", txn, table,
                                   key_of(table, None, rec.after))
            elif op == "u":
                query, args = table.update(rec.before, rec.after)
                status = await self._guarded(sql.execute, query, args)
                if status is None:
                    self._conflict("update_exists", txn, table,
                                   key_of(table, rec.before, rec.after), self._clash)
                elif affected(status) == 0:
                    self._conflict("update_missing", txn, table,
                                   key_of(table, rec.before, rec.after))
                    if self.conflict == "upsert":
                        # the old row is gone; the new key may exist (last writer wins)
                        query, args = table.insert(rec.after, "upsert")
                        if await self._guarded(sql.fetch, query, args) is None:
                            self._conflict("update_exists", txn, table,
                                           key_of(table, rec.before, rec.after), self._clash)
            elif op == "d":
                query, args = table.delete(rec.before)
                if affected(await sql.execute(query, *args)) == 0:
                    self._conflict("delete_missing", txn, table, key_of(table, rec.before, None))
            elif op == "t":
                await sql.execute(table.truncate(rec.truncate))
        except (asyncpg.UniqueViolationError, asyncpg.ExclusionViolationError) as exc:
            kind = "update_exists" if op == "u" else "insert_exists"
            raise ApplyConflict(f"{kind} on {table.schema}.{table.name} key "
                                f"{key_of(table, rec.before, rec.after)} (transaction {txn.id}):"
                                f" {_reason(exc)}") from exc
        except asyncpg.PostgresError as exc:
            if connection_lost(exc):
                raise SourceUnavailable(f"target connection lost: {exc}") from exc
            raise ApplyError(f"applying {op} to {table.schema}.{table.name} key "
                             f"{key_of(table, rec.before, rec.after)} (transaction {txn.id}) "
                             f"failed: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    """The server's message and detail, on one line."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    detail = getattr(exc, "detail", None)
    return f"{text} ({detail})" if detail else text
