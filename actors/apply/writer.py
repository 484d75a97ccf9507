"""The applier's writer: released source transactions in, one target transaction each.

Rules:

* Fast path (``router.apply.batches``): the transactions waiting in the inbox
  (``actors.apply.inbox``), up to ``BATCH_ROWS`` rows, go to the target as one simple-query
  script: many small transactions cost one round trip. Consecutive ones of at most
  ``target.group_rows`` rows together share one target transaction, ``begin; set-based
  statements; origin xact setup (the last one's); commit``: the server's time per one-row
  transaction went to its statements (each pays its start, snapshot and executor), which a
  group's set-based statements share. A group commits whole or not at all, so the origin's
  progress is always exactly the last source transaction applied; a group that fails is sent
  again one transaction a target transaction, so the failing one is found as before. A
  transaction of ``STREAM_ROWS`` rows or more (or spilled to disk) is streamed into one open
  target transaction, ``STREAM_ROWS`` rows an execute.
* While the target runs a script, the next batch is taken and its script made
  (``_build_ahead``), so this process and the target work at the same time. That script
  was made with the session's prepared statements and table definitions as they were: a
  failed script forgets it (the batch stays next) and it is made again.
* The origin moves only with a committed transaction (``actors.apply.target``): its setup
  is the last statement before COMMIT, so a transaction that fails never moves it (nor the
  progress row, which rolls back with it); a COMMIT that fails after it puts the origin
  back. Every target transaction upserts the progress row (its commit LSN) in the setup's
  statement, evaluated before the setup: a restart puts back an origin that an abort after
  the setup moved (the client gone before COMMIT). When the transaction's last statement
  executes a prepared one-row statement (and the target has no deferrable checks to force
  first), the row and the setup are folded into it (``router.apply.batches.with_origin``:
  evaluated after that change and its check), so a one-row transaction is three
  statements.
* The last transaction of a batch that carries restart offsets also writes them to the
  progress row, so they commit with it; the others leave the row's offsets.
* Any SQL error of the fast path (a conflict, a missing column…) rolls back the transaction
  it hit; the transactions before it are committed (the session's origin progress says
  which). That one is applied again change by change under ``target.conflict``
  (``actors.apply.rows``: a conflict is one row's, counted and logged with its key, or
  stops the applier under ``error``; any other error stops it with one line), then the
  fast path goes on with the rest.
* Snapshot and backfill rows (``op: "r"``, released as snapshot batches by
  ``router.apply.reassembly``) are upserts by key under every policy, in a transaction of their
  own that leaves the origin where it is.
"""

from __future__ import annotations

import logging
import time
from itertools import chain

import asyncpg
import trio

from router.config.applier import ApplyConfig, table_map
from router.apply.batches import Prepared, statements, with_origin
from router.errors import ApplyError, SourceUnavailable
from router.postgres.lsn import format_lsn
from router.apply.reassembly import SourceTransaction
from router.apply.statements import TargetTable

from ..services import log
from ..services.sql import SqlSession
from .inbox import CAUGHT_UP, STREAM_ROWS, Inbox, streamed
from .rows import ChangeByChange, connection_lost, rollback
from .target import (has_deferrable_checks, load_table, offsets_json, progress_statement,
                     progress_upsert, rewind_origin, session_progress)

_log = log.get("applier")
#: scheduling rounds given to a script to reach the target's socket (trio-asyncio hands it
#: to asyncpg on asyncio's loop) before this process makes the next one: measured, asyncpg
#: had written it after at most one
AHEAD_ROUNDS = 3


class ApplyStats:
    def __init__(self):
        self.transactions = 0
        self.changes = 0
        self.skipped = 0  # transactions at or below the target's progress (a restart)
        self.fetched = 0  # records read from Kafka
        self.scripts = 0  # round trips of the fast path
        self.ahead = 0  # scripts made while the target ran the one before
        self.slow = 0  # transactions applied change by change after a fast-path error
        self.snapshot_rows = 0  # snapshot and backfill rows applied (upserts)
        self.spills = 0  # transactions moved to disk while waiting for their END
        self.buffered_peak = 0  # bytes of records waiting for their END, at most
        self.conflicts: dict[str, int] = {}
        self.last_commit_time: str | None = None  # of the last applied source transaction
        self.progress_lsn = 0


class WriterActor:
    def __init__(self, *, sql: SqlSession, cfg: ApplyConfig, inbox: trio.MemoryReceiveChannel,
                 stats: ApplyStats, progress_lsn: int):
        self.sql = sql
        self.cfg = cfg
        self.conflict = cfg.target.conflict
        self.table_map = table_map(cfg.target)
        self.inbox = Inbox(inbox, stats)
        self.stats = stats
        self.progress_lsn = progress_lsn
        self._tables: dict[tuple[str, str], TargetTable] = {}
        self.prepared = Prepared()
        self.caught_up = False
        self.receive_s = 0.0  # seconds waiting for transactions
        self.sql_s = 0.0  # seconds waiting for the target
        #: the target has deferrable checks: forced before the origin setup
        self.deferrable: bool | None = None
        self.rows = ChangeByChange(sql, cfg, stats, self._tables)
        #: the groups of the last script: first transaction's index -> the next group's
        self._group_end: dict[int, int] = {}
        #: the next batch, taken off the queue while the target ran the last script
        self._ahead: list[SourceTransaction] | None = None
        #: (that batch, its ``_build``): made with the prepared statements and tables as
        #: they were; forgotten when a script fails
        self._built: tuple | None = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Receives lists of released transactions (or ``CAUGHT_UP``), applies them in
        batches."""
        task_status.started()
        self.deferrable = await has_deferrable_checks(self.sql)
        queue = self.inbox.queue
        with self.inbox.channel:
            while True:
                batch, self._ahead = self._ahead, None
                if batch is None:
                    if not queue:
                        t0 = time.perf_counter()
                        try:
                            queue.extend(await self.inbox.channel.receive())
                        except trio.EndOfChannel:
                            return
                        finally:
                            self.receive_s += time.perf_counter() - t0
                    self.inbox.top_up()
                    if queue[0] is CAUGHT_UP:
                        self.caught_up = True
                        return
                    batch = self.inbox.take(self.progress_lsn)
                if batch:
                    await self.apply(batch)

    async def _build_ahead(self) -> None:
        """While the target runs a script: the next batch taken and its script made, so the
        target waits for this process only as long as making it takes longer. Nothing is
        made for a batch of tables not known yet."""
        for _ in range(AHEAD_ROUNDS):  # the script on its way out first
            await trio.lowlevel.checkpoint()
        if self._ahead is None:
            self.inbox.top_up()
            if not self.inbox.small_next():
                return
            self._ahead = self.inbox.take(self.progress_lsn)
        batch = self._ahead
        if (self._built is None and batch
                and all(k in self._tables for t in batch for k in t.tables)):
            try:
                built = self._build(batch, True)
            except Exception:  # noqa: BLE001 - made again in its turn, where it is handled
                return
            if built[2] is None:  # statements made for every transaction
                self._built = (batch, built)
                self.stats.ahead += 1

    async def _execute_ahead(self, script: str) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._build_ahead)
                await self._execute(script)
        except BaseExceptionGroup as group:  # the script's error, as ``_execute`` raises it
            if len(group.exceptions) == 1:
                raise group.exceptions[0]
            raise

    async def _ensure_tables(self, txn: SourceTransaction) -> None:
        for schema, name in txn.tables:
            if (schema, name) not in self._tables:
                t_schema, t_name = self.table_map.get((schema, name), (schema, name))
                self._tables[(schema, name)] = await load_table(self.sql, t_schema, t_name)

    def _progress(self, lsn: str, offsets: str) -> str:
        return progress_upsert(self.cfg.target, lsn, offsets)

    def _origin(self, txn: SourceTransaction, offsets: str | None) -> str:
        """The progress row and the origin setup (one statement: the setup after the row),
        preceded by the deferred checks: the last statements before COMMIT, so nothing but
        COMMIT itself can fail after them."""
        setup = self.prepared.execute(
            ("origin",), [format_lsn(txn.commit_lsn), txn.commit_time, offsets],
            lambda: (f"with _p as ({self._progress('$1', '$3')}) select "
                     "pg_replication_origin_xact_setup($1::pg_lsn, $2::timestamptz) from _p"))
        return ("set constraints all immediate;" if self.deferrable else "") + setup + ";"

    async def _execute(self, script: str) -> None:
        t0 = time.perf_counter()
        try:
            await self.sql.execute(script)
        finally:
            self.sql_s += time.perf_counter() - t0

    async def _prepare(self) -> None:
        new = self.prepared.new
        if new:
            self.prepared.new = []
            await self._execute(";".join(new))

    def _end(self, txn: SourceTransaction, offsets: str | None) -> str:
        return self._origin(txn, offsets) + "commit;"

    async def apply(self, batch: list[SourceTransaction]) -> None:
        if batch[0].snapshot:
            await self._ensure_tables(batch[0])
            await self._snapshot(batch[0])
            return
        for i, txn in enumerate(batch):
            try:
                await self._ensure_tables(txn)
            except ApplyError:
                if i:  # those before it go in
                    await self._apply(batch[:i])
                raise
        await self._apply(batch)

    async def _apply(self, batch: list[SourceTransaction]) -> None:
        solo = 0  # transactions at the head of the batch to send one by one: a failed group
        while batch:
            self._group_end = {}
            try:
                if streamed(batch[0]):
                    await self._stream(batch[0])
                    done = 1
                elif solo:
                    await self._script(batch[:solo], grouped=False)
                    done = solo
                else:
                    await self._script(batch)
                    done = len(batch)
            except asyncpg.PostgresError as exc:
                self._built = None
                if connection_lost(exc):
                    raise SourceUnavailable(f"target connection lost: {exc}") from exc
                commit_failed = not self.sql.in_transaction
                await self._rollback()
                await self._forget_prepared()
                applied = await session_progress(self.sql)
                if commit_failed and applied > self.progress_lsn:
                    # a COMMIT failed past its origin setup, and the abort moved the origin
                    # to that transaction (a group's last): those before it committed
                    failed_at = sum(1 for t in batch if t.commit_lsn < applied)
                    first = next((i for i, j in self._group_end.items() if i <= failed_at < j),
                                 failed_at)
                    applied = batch[first - 1].commit_lsn if first else self.progress_lsn
                    await rewind_origin(self.sql, self.cfg.target.origin, applied)
                done = sum(1 for t in batch if t.commit_lsn <= applied)
                self._applied(batch[:done])
                if done == len(batch):  # failed after the last commit: nothing to redo
                    return
                end = self._group_end.get(done, done + 1)
                batch = batch[done:]
                if end - done > 1:  # which transaction of the group failed: each on its own
                    solo = end - done
                    continue
                solo = 0
                failed = batch[0]
                log.event(_log, "applying change by change", transaction=failed.id,
                          reason=str(exc).splitlines()[0], level=logging.DEBUG)
                # the target may have changed (a trigger made, a column added): read its
                # tables again before going on
                self._tables.clear()
                await self._ensure_tables(failed)
                await self.rows.apply(failed, self.progress_lsn, self.deferrable)
                self.stats.slow += 1
                self._applied([failed])
                batch = batch[1:]
                continue
            except BaseException:
                await self._rollback()
                raise
            self._applied(batch[:done])
            batch = batch[done:]
            solo = 0

    async def _forget_prepared(self) -> None:
        """Drop this writer's prepared statements (a failed PREPARE may have left some
        missing), not asyncpg's own (its statement cache still names them)."""
        names = await self.sql.fetch("select name from pg_prepared_statements where "
                                     "name like 'pgr\\_%'")
        if names:
            await self.sql.execute(";".join(f"deallocate {r[0]}" for r in names))
        self.prepared = Prepared(self.prepared.next_number)
        self._built = None

    async def _snapshot(self, txn: SourceTransaction) -> None:
        """Snapshot rows: upserts in one transaction that leaves the origin alone (no setup:
        the session's last setup is the origin's progress, which a commit does not move
        back)."""
        parts = ["begin;"]
        for stmt in statements(txn.records, self._tables, self.prepared, upsert=True):
            parts.append(stmt)
            parts.append(";")
        if txn.resume is not None:
            parts.append(progress_statement(self.cfg.target, self.progress_lsn, txn.resume)
                         + ";")
        parts.append("commit;")
        try:
            await self._send(parts)
        except asyncpg.PostgresError as exc:
            if connection_lost(exc):
                raise SourceUnavailable(f"target connection lost: {exc}") from exc
            await self._rollback()
            await self._forget_prepared()
            # a key twice in one statement, a clash on another unique index: row by row
            await self.rows.apply(txn, self.progress_lsn, self.deferrable)
            self.stats.slow += 1
        except BaseException:
            await self._rollback()
            raise
        self.stats.snapshot_rows += txn.count
        txn.records.close()

    def _applied(self, txns: list[SourceTransaction]) -> None:
        for txn in txns:
            self.stats.transactions += 1
            self.stats.changes += txn.count
            self.progress_lsn = txn.commit_lsn
        if txns:  # for the metrics
            self.stats.last_commit_time = txns[-1].commit_time
            self.stats.progress_lsn = self.progress_lsn
            txn.records.close()

    def _groups(self, batch: list[SourceTransaction], grouped: bool):
        """The batch cut into runs of consecutive transactions of at most ``group_rows``
        rows together (one transaction each when not ``grouped``)."""
        limit = self.cfg.target.group_rows if grouped else 1
        i = 0
        while i < len(batch):
            j, rows = i + 1, batch[i].count
            while j < len(batch) and rows + batch[j].count <= limit:
                rows += batch[j].count
                j += 1
            yield i, j
            i = j

    async def _script(self, batch: list[SourceTransaction], grouped: bool = True) -> None:
        built, self._built = self._built, None
        if built is not None and built[0] is batch and grouped:
            parts, self._group_end, error = built[1]
        else:
            parts, self._group_end, error = self._build(batch, grouped)
        if error is not None:
            failed, exc = error
            if failed:  # the transactions before it go in
                await self._send(parts)
                self._applied(batch[:failed])
            raise exc
        await self._send(parts, ahead=grouped)

    def _build(self, batch: list[SourceTransaction], grouped: bool):
        """The script of a batch: ``(parts, group ends, error)``; ``error`` is ``(index,
        ApplyError)`` of a transaction whose statements cannot be made (``parts`` then
        hold the transactions before it)."""
        parts: list[str] = []
        last = max((i for i, t in enumerate(batch) if t.resume is not None), default=-1)
        groups = list(self._groups(batch, grouped))
        group_end = dict(groups)
        while groups:
            i, j = groups.pop(0)
            try:
                stmts = list(statements(chain.from_iterable(t.records for t in batch[i:j]),
                                        self._tables, self.prepared))
            except ApplyError as exc:
                if j - i > 1:  # which transaction: each on its own
                    groups[:0] = [(k, k + 1) for k in range(i, j)]
                    continue
                return parts, group_end, (i, exc)
            txn = batch[j - 1]
            parts.append("begin;")
            folded = None
            # every transaction moves the progress row to its LSN; the offsets it carries
            offsets = offsets_json(batch[last].resume) if i <= last < j else None
            if j - i == 1 and stmts and not self.deferrable:
                folded = with_origin(stmts[-1], self.prepared, format_lsn(txn.commit_lsn),
                                     txn.commit_time, self._progress, offsets)
            if folded is not None:
                stmts[-1] = folded
            for stmt in stmts:
                parts.append(stmt)
                parts.append(";")
            parts.append("commit;" if folded is not None else self._end(txn, offsets))
        return parts, group_end, None

    async def _stream(self, txn: SourceTransaction) -> None:
        parts: list[str] = ["begin;"]
        rows = 0
        for stmt in statements(txn.records, self._tables, self.prepared):
            parts.append(stmt)
            parts.append(";")
            rows += stmt.count("},{") + stmt.count("),") + 1  # about the rows of a statement
            if rows >= STREAM_ROWS:
                await self._send(parts)
                parts, rows = [], 0
        parts.append(self._end(txn, offsets_json(txn.resume)))
        await self._send(parts)

    async def _send(self, parts: list[str], ahead: bool = False) -> None:
        await self._prepare()
        if ahead:
            await self._execute_ahead("".join(parts))
        else:
            await self._execute("".join(parts))
        self.stats.scripts += 1

    async def _rollback(self) -> None:
        await rollback(self.sql)
