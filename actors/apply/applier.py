"""The applier: the router's topics in, whole source transactions applied to another
PostgreSQL, each tagged with a replication origin (``pgrouter apply``).

Rules:

* Two actors joined by a small channel: the consumer (kafka-python, blocking calls in a
  worker thread) reads the transaction topic and the data topics its END records name,
  and releases complete transactions in source commit order (``router.reassembly``); the
  writer applies each one in one target transaction.
* The writer's session is set up with ``pg_replication_origin_session_setup(origin)`` (the
  origin is created when missing); every transaction starts with
  ``pg_replication_origin_xact_setup(source commit_lsn, source commit time)``. So the
  target's walsender sends those transactions with an Origin message (its router drops
  them with ``origin = "none"``), and the origin's progress commits atomically with them.
* Exactly-once: at start the origin's durable progress is read
  (``pg_replication_origin_progress(origin, true)``); transactions at or below it are
  skipped. Reading always starts at the beginning of the topics (no consumer offsets), so
  nothing depends on Kafka-side state.
* Conflicts (insert of an existing key, update/delete of a missing row) follow
  ``target.conflict``: ``error`` stops with ``ApplyConflict``, ``skip`` counts and goes on,
  ``upsert`` writes the incoming row (last writer wins). Each is logged with its key.
* Transient failures (Kafka or the target unavailable) restart both actors with backoff,
  from the origin's progress. ``--until-caught-up`` ends once every transaction whose END
  was in the transaction topic at start is applied.
"""

from __future__ import annotations

import logging
import time

import asyncpg
import trio

from router.apply_config import ApplyConfig
from router.errors import ApplyConflict, ApplyError, SourceUnavailable
from router.lsn import format_lsn, parse_lsn
from router.reassembly import Reassembler, SourceTransaction
from router.statements import TargetTable, affected, key_of

from ..services import log
from .topic_reader import TopicReader
from ..services.sql import SqlSession
from ..services.retry import run_with_retries

_log = log.get("applier")
TRANSACTIONS = 16  # channel size, in transactions
ORIGIN_BUSY_WAIT = 30.0


class ApplyStats:
    def __init__(self):
        self.transactions = 0
        self.changes = 0
        self.skipped = 0  # transactions at or below the origin's progress
        self.conflicts: dict[str, int] = {}


class _CaughtUp:
    pass


CAUGHT_UP = _CaughtUp()


class ConsumerActor:
    def __init__(self, *, reader: TopicReader, reassembler: Reassembler,
                 out: trio.MemorySendChannel, until_caught_up: bool = False,
                 stop: trio.Event | None = None):
        self.reader = reader
        self.reassembler = reassembler
        self.out = out
        self.until_caught_up = until_caught_up
        self.stop = stop if stop is not None else trio.Event()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        reader, ra = self.reader, self.reassembler
        task_status.started()
        async with self.out:
            end_at_start = None
            if self.until_caught_up:
                end_at_start = await trio.to_thread.run_sync(reader.transactions_end_offset)
                if end_at_start is None:
                    log.event(_log, "no transaction topic yet: nothing to apply")
                    await self.out.send(CAUGHT_UP)
                    return
            else:
                while not await trio.to_thread.run_sync(reader.wait_for_transactions_topic):
                    if self.stop.is_set():
                        return
            while not self.stop.is_set():
                batch = await trio.to_thread.run_sync(reader.poll)
                new_topics: list[str] = []
                for topic, offset, value in batch:
                    if topic == reader.transactions_topic:
                        new_topics += ra.add_transaction_record(value, offset)
                    else:
                        ra.add_record(topic, value)
                if new_topics:
                    await trio.to_thread.run_sync(reader.add_topics, new_topics)
                for txn in ra.ready():
                    await self.out.send(txn)
                if end_at_start is not None:
                    oldest = ra.oldest_pending_offset()
                    if reader.transactions_position() >= end_at_start and (
                            oldest is None or oldest >= end_at_start):
                        await self.out.send(CAUGHT_UP)
                        return


class WriterActor:
    def __init__(self, *, sql: SqlSession, cfg: ApplyConfig, inbox: trio.MemoryReceiveChannel,
                 stats: ApplyStats, progress_lsn: int):
        self.sql = sql
        self.origin = cfg.target.origin
        self.conflict = cfg.target.conflict
        self.table_map = cfg.target.tables
        self.inbox = inbox
        self.stats = stats
        self.progress_lsn = progress_lsn
        self._tables: dict[tuple[str, str], TargetTable] = {}
        self.caught_up = False

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with self.inbox:
            async for txn in self.inbox:
                if txn is CAUGHT_UP:
                    self.caught_up = True
                    return
                if txn.commit_lsn <= self.progress_lsn:
                    self.stats.skipped += 1
                    continue
                await self.apply(txn)
                self.progress_lsn = txn.commit_lsn

    async def table(self, schema: str, name: str) -> TargetTable:
        found = self._tables.get((schema, name))
        if found is not None:
            return found
        mapped = self.table_map.get(f"{schema}.{name}")
        t_schema, t_name = mapped.split(".", 1) if mapped else (schema, name)
        qname = '"' + t_schema.replace('"', '""') + '"."' + t_name.replace('"', '""') + '"'
        try:
            rows = await self.sql.fetch(
                "select a.attname, format_type(a.atttypid, a.atttypmod) as type "
                "from pg_attribute a where a.attrelid = $1::text::regclass and a.attnum > 0 "
                "and not a.attisdropped order by a.attnum", qname)
            keys = await self.sql.fetch(
                "select i.indisprimary, array(select a.attname from unnest(i.indkey) with "
                "ordinality k(n, o) join pg_attribute a on a.attrelid = i.indrelid and "
                "a.attnum = k.n order by k.o) as cols from pg_index i where i.indrelid = "
                "$1::text::regclass and (i.indisprimary or i.indisreplident) "
                "order by i.indisprimary desc", qname)
        except asyncpg.UndefinedTableError as exc:
            raise ApplyError(f"target table {t_schema}.{t_name} does not exist") from exc
        key = tuple(keys[0]["cols"]) if keys else ()
        table = TargetTable(t_schema, t_name, {r["attname"]: r["type"] for r in rows}, key)
        self._tables[(schema, name)] = table
        return table

    async def apply(self, txn: SourceTransaction) -> None:
        sql = self.sql
        await sql.execute("begin")
        try:
            await sql.execute("select pg_replication_origin_xact_setup($1::text::pg_lsn, "
                              "$2::text::timestamptz)", format_lsn(txn.commit_lsn),
                              txn.commit_time)
            for topic, rec in txn.records:
                await self._change(txn, rec)
            await sql.execute("commit")
        except BaseException:
            with trio.move_on_after(5) as scope:
                scope.shield = True
                try:
                    await sql.execute("rollback")
                except Exception:  # the connection is gone: the server rolled back
                    pass
            raise
        self.stats.transactions += 1
        self.stats.changes += len(txn.records)

    def _conflict(self, kind: str, txn: SourceTransaction, table: TargetTable, key: dict):
        if self.conflict == "error":
            raise ApplyConflict(f"{kind} on {table.schema}.{table.name} key {key} "
                                f"(transaction {txn.id}); set target.conflict = skip or upsert "
                                "to go on")
        self.stats.conflicts[kind] = self.stats.conflicts.get(kind, 0) + 1
        log.event(_log, "conflict", level=logging.WARNING, kind=kind, policy=self.conflict,
                  table=f"{table.schema}.{table.name}", key=key, transaction=txn.id)

    async def _change(self, txn: SourceTransaction, rec) -> None:
        op = rec.op
        if op == "m":
            return
        src = rec.source
        table = await self.table(src.schema, src.table)
        sql = self.sql
        try:
            if op in ("c", "r"):
                query, args = table.insert(rec.after, self.conflict)
                if self.conflict == "error":
                    await sql.execute(query, *args)
                else:
                    rows = await sql.fetch(query, *args)
                    if not rows or rows[0][0] is False:
                        self._conflict("insert_exists", txn, table,
                                       key_of(table, None, rec.after))
            elif op == "u":
                query, args = table.update(rec.before, rec.after)
                if affected(await sql.execute(query, *args)) == 0:
                    self._conflict("update_missing", txn, table,
                                   key_of(table, rec.before, rec.after))
                    if self.conflict == "upsert":
                        query, args = table.insert(rec.after, "error")
                        await sql.execute(query, *args)
            elif op == "d":
                query, args = table.delete(rec.before)
                if affected(await sql.execute(query, *args)) == 0:
                    self._conflict("delete_missing", txn, table, key_of(table, rec.before, None))
            elif op == "t":
                await sql.execute(table.truncate(rec.truncate))
        except asyncpg.UniqueViolationError as exc:
            raise ApplyConflict(f"insert_exists on {table.schema}.{table.name} key "
                                f"{key_of(table, rec.before, rec.after)} (transaction {txn.id}):"
                                f" {exc}") from exc
        except asyncpg.PostgresError as exc:
            if isinstance(exc, (asyncpg.PostgresConnectionError,
                                asyncpg.AdminShutdownError)):
                raise SourceUnavailable(f"target connection lost: {exc}") from exc
            raise ApplyError(f"applying {op} to {table.schema}.{table.name} (transaction "
                             f"{txn.id}) failed: {exc}") from exc


async def setup_origin(sql: SqlSession, origin: str) -> int:
    """Create the origin when missing, bind this session to it, return its durable
    progress (the source commit LSN of the last transaction applied)."""
    if await sql.fetchval("select pg_replication_origin_oid($1)", origin) is None:
        try:
            await sql.fetchval("select pg_replication_origin_create($1)", origin)
            log.event(_log, "replication origin created", origin=origin)
        except asyncpg.UniqueViolationError:
            pass  # created concurrently
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
    return parse_lsn(progress) if progress else 0


class Applier:
    """Wires consumer and writer, restarts both on transient failures, drains on signals."""

    def __init__(self, cfg: ApplyConfig, *, until_caught_up: bool = False,
                 retry_timeout: float | None = None):
        self.cfg = cfg
        self.until_caught_up = until_caught_up
        self.retry_timeout = retry_timeout
        self.stats = ApplyStats()
        self.stop = trio.Event()

    async def run(self) -> int:
        import signal

        import trio_asyncio

        from router.errors import PgRouterError

        error: PgRouterError | None = None
        async with trio_asyncio.open_loop():
            async with trio.open_nursery() as nursery:
                async def signals():
                    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                        async for _ in sigs:
                            if self.stop.is_set():
                                nursery.cancel_scope.cancel()
                                return
                            log.event(_log, "draining")
                            self.stop.set()
                nursery.start_soon(signals)
                try:
                    await self._run_with_retries()
                except PgRouterError as exc:
                    error = exc  # raised below, outside the nursery's exception group
                finally:
                    nursery.cancel_scope.cancel()
        self._report("applier stopped")
        if error is not None:
            raise error
        return 0

    def _report(self, msg: str) -> None:
        s = self.stats
        log.event(_log, msg, transactions=s.transactions, changes=s.changes,
                  skipped=s.skipped, conflicts=sum(s.conflicts.values()),
                  **{f"conflicts_{k}": v for k, v in s.conflicts.items()})

    async def _run_with_retries(self) -> None:
        await run_with_retries(self._run_once, stop=self.stop, logger=_log,
                               give_up_after=self.retry_timeout)

    async def _run_once(self) -> None:
        cfg = self.cfg
        async with await SqlSession.connect(cfg.target.dsn, path="target.dsn") as sql:
            progress = await setup_origin(sql, cfg.target.origin)
            log.event(_log, "applying", dsn=cfg.target.dsn, origin=cfg.target.origin,
                      origin_progress=format_lsn(progress),
                      transactions_topic=cfg.kafka.transactions_topic,
                      conflict=cfg.target.conflict)
            reader = await trio.to_thread.run_sync(TopicReader, cfg.kafka)
            try:
                tx, rx = trio.open_memory_channel(TRANSACTIONS)
                consumer = ConsumerActor(reader=reader, reassembler=Reassembler(
                    reader.wants, progress), out=tx, until_caught_up=self.until_caught_up,
                    stop=self.stop)
                writer = WriterActor(sql=sql, cfg=cfg, inbox=rx, stats=self.stats,
                                     progress_lsn=progress)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._progress_lines)
                    await nursery.start(consumer.run)
                    # returns at CAUGHT_UP, or when the consumer stops (drain)
                    await writer.run()
                    nursery.cancel_scope.cancel()
            finally:
                with trio.move_on_after(10) as scope:
                    scope.shield = True
                    await trio.to_thread.run_sync(reader.close)
        if writer.caught_up:
            log.event(_log, "caught up", origin_progress=format_lsn(writer.progress_lsn))

    async def _progress_lines(self) -> None:
        while True:
            await trio.sleep(self.cfg.log.progress_interval)
            self._report("progress")
