"""Reading table rows with ``COPY (SELECT …) TO STDOUT`` (asyncpg, ``SqlSession.copy_out``).

Rules:

* Rows arrive as COPY text — the types' output functions, what pgoutput sends in text
  mode — in pieces; whole lines are parsed by ``router.snapshot.core`` and handed to ``deliver``
  (a trio async function) in batches. ``deliver`` sends into a bounded channel, so a table of
  any size holds a few batches in memory and a slow Kafka slows the COPY down (the server
  waits on the socket).
* Sessions keep the server's TimeZone (as the walsender session does), so a value reads the
  same in a snapshot row and in a change.
* The snapshot a reader sees is its caller's business: ``import_snapshot`` opens a
  REPEATABLE READ transaction on an exported snapshot (the initial snapshot), otherwise each
  read is its own statement (a backfill chunk).
* A table is locked (ACCESS SHARE, to the end of the read's transaction) before it is read.
  TRUNCATE and the rewriting commands (ALTER TABLE … TYPE, ADD COLUMN with a volatile
  default, VACUUM FULL, CLUSTER) give the table a new file, whose rows a snapshot older
  than the command does not see (they are not MVCC-safe): a read would find the table
  empty. With the lock, none of them commits while the table is read; a backfill chunk
  takes it before its snapshot (``begin_read``: the first statement after BEGIN; LOCK
  takes no snapshot), so its snapshot sees any rewrite committed before; the initial
  snapshot's is older than the lock, so ``rewritten`` says whether the file the lock
  found is still the one the snapshot saw.
* PostgreSQL errors become ``SourceError``s naming what was read; a lost connection is
  ``SourceUnavailable`` (the supervisor retries).
"""

from __future__ import annotations

import asyncpg
import trio

from router.formats.envelope import TxContext
from router.errors import SourceError
from router.pgoutput import Relation
from router.routing.change_router import RoutedChunk
from router.snapshot.core import copy_rows, snapshot_xip
from router.snapshot.rows import CopyText, SnapshotRows, encode_text

from ..services.sql import SqlSession
from .jobs import SHAPE

#: seconds a session may take to close, shielded from cancellation (a close cancelled
#: half-way makes asyncpg report a lost connection to the event loop)
CLOSE_TIMEOUT = 5.0

#: rows handed over at a time (about)
BATCH_ROWS = 2000


class TableReader:
    def __init__(self, sql: SqlSession):
        self.sql = sql

    @classmethod
    async def open(cls, dsn: str) -> "TableReader":
        return cls(await SqlSession.connect(dsn, utc=False,
                                            application_name="pgrouter-snapshot"))

    async def import_snapshot(self, snapshot: str) -> None:
        await import_snapshot(self.sql, snapshot)

    async def begin_read(self, table: tuple[str, str], shape: str, of: tuple = ()
                         ) -> tuple[frozenset[int], int, tuple]:
        """Opens a REPEATABLE READ transaction for a backfill chunk of ``table``, locked
        before the transaction's snapshot is taken (a rewrite waiting for the lock commits
        first, and the snapshot sees its rows); returns the transactions its snapshot sees
        in progress (``router.snapshot.core.snapshot_xip``), the table's
        ``pg_relation_filenode`` and the ``shape`` (SQL, ``{rel}`` a table's oid) of each
        table of ``of``, as the snapshot sees them."""
        names = [_qualified(t) for t in of]
        shapes = "".join(", " + shape.format(rel=f"to_regclass(${i}::text)") + f" as s{i}"
                         for i in range(2, len(names) + 2))
        try:
            await self.sql.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                await self.sql.execute(f"LOCK TABLE ONLY {_qualified(table)} IN ACCESS SHARE "
                                       "MODE")
            except asyncpg.UndefinedTableError:
                # dropped (or renamed) since the job was planned: no shape, the caller plans
                # it again and finds it gone
                await self.sql.execute("ROLLBACK")
                await self.sql.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                return frozenset(), 0, (None,) * len(names)
            row = (await self.sql.fetch(
                "select pg_current_snapshot()::text as snapshot, "
                "pg_relation_filenode(to_regclass($1))::int8 as filenode" + shapes,
                _qualified(table), *names))[0]
            return (snapshot_xip(row["snapshot"]), int(row["filenode"] or 0),
                    tuple(row[f"s{i}"] for i in range(2, len(names) + 2)))
        except asyncpg.PostgresError as exc:
            raise SourceError(f"cannot start a snapshot read of {table[0]}.{table[1]}: "
                              f"{exc}") from exc

    async def rewritten(self, table: tuple[str, str]) -> bool:
        """In the transaction of an imported snapshot: locks ``table`` (no rewrite commits
        until the transaction ends) and says whether its file is not the one the snapshot
        saw — TRUNCATE, a rewriting ALTER TABLE, VACUUM FULL or CLUSTER committed since (the
        rows in the new file are invisible to the snapshot, or moved) — or the table is
        gone (dropped or renamed). The lock comes first and the name is looked up under it:
        a table dropped or renamed just before is not there to lock (a savepoint keeps the
        snapshot's transaction going), and the oid is the locked table's."""
        name = _qualified(table)
        try:
            await self.sql.execute("SAVEPOINT pgrouter_lock")
            try:
                await self.sql.execute(f"LOCK TABLE ONLY {name} IN ACCESS SHARE MODE")
            except asyncpg.UndefinedTableError:
                await self.sql.execute("ROLLBACK TO SAVEPOINT pgrouter_lock")
                return True
            await self.sql.execute("RELEASE SAVEPOINT pgrouter_lock")
            # pg_class as the snapshot saw it; to_regclass and pg_relation_filenode: the
            # catalog as it is now (the lock brought the relation cache up to date)
            return not await self.sql.fetchval(
                "select coalesce((select relfilenode::int8 from pg_class where oid = "
                "to_regclass($1)) = pg_relation_filenode(to_regclass($1))::int8, false)", name)
        except asyncpg.PostgresError as exc:
            raise SourceError(f"snapshot reader failed locking {table[0]}.{table[1]}: "
                              f"{exc}") from exc

    async def end_read(self) -> None:
        await self.sql.execute("COMMIT")

    async def estimate(self, table: tuple[str, str]) -> int:
        """Rows of the table as the planner's statistics say (0 when never analyzed)."""
        n = await self.sql.fetchval(
            "select greatest(c.reltuples, 0)::int8 from pg_class c join pg_namespace n on "
            "n.oid = c.relnamespace where n.nspname = $1 and c.relname = $2", *table)
        return int(n or 0)

    async def copy(self, select: str, deliver, what: str, params: tuple = (),
                   batch_rows: int = BATCH_ROWS, text: bool = False) -> int:
        """Runs ``COPY (select) TO STDOUT`` (``$n`` parameters from ``params``);
        ``await deliver(rows)`` gets the rows in batches: lists of tuples, or with ``text``
        the COPY text itself (``CopyText``: whole lines, parsed and encoded in C by
        ``encode_chunk``). Returns the number of rows."""
        state = {"rest": b"", "rows": [], "lines": 0, "count": 0}

        async def sink(data: bytes) -> None:
            data = state["rest"] + data
            end = data.rfind(b"\n") + 1
            state["rest"] = data[end:]
            if end and text:
                state["rows"].append(data[:end] if state["rest"] else data)
                state["lines"] += data.count(b"\n", 0, end)
                if state["lines"] >= batch_rows:
                    await flush()
            elif end:
                state["rows"].extend(copy_rows(data[:end]))
                if len(state["rows"]) >= batch_rows:
                    await flush()

        async def flush() -> None:
            rows, state["rows"] = state["rows"], []
            if rows and text:
                rows = CopyText(b"".join(rows), state["lines"])
                state["lines"] = 0
            if rows:
                state["count"] += len(rows)
                await deliver(rows)

        try:
            await self.sql.copy_out(select, *params, sink=sink)
        except asyncpg.PostgresError as exc:
            raise SourceError(f"snapshot reader failed {what}: {exc}") from exc
        if state["rest"]:
            raise SourceError(f"snapshot reader failed {what}: COPY data ended mid-row")
        await flush()
        return state["count"]

    async def absent(self, select: str, keys: str) -> list[tuple]:
        """The rows of ``select`` (``$1`` = ``keys``) as tuples of text (a repair's keys the
        table does not hold), in the chunk's read transaction."""
        try:
            return [tuple(r) for r in await self.sql.fetch(select, keys)]
        except asyncpg.PostgresError as exc:
            raise SourceError(f"snapshot reader failed looking up a repair's keys: "
                              f"{exc}") from exc

    async def close(self) -> None:
        await close_session(self.sql)


async def encode_chunk(rows: SnapshotRows, relation: Relation, batch: list | CopyText,
                       tx: TxContext, first_seq: int) -> RoutedChunk:
    """``rows.chunk(relation, batch, tx, first_seq)``; COPY text (a table on the C path) is
    encoded in a worker thread, in C without the GIL (``router.snapshot.rows.encode_text``):
    the sessions' batches are encoded at once, beside the event loop's thread that reads
    the sockets and hands records to the producer."""
    if type(batch) is CopyText:
        parts = rows.text_parts(relation, tx)
        records = await trio.to_thread.run_sync(encode_text, parts, batch.data, tx.end_lsn,
                                                first_seq, rows.packed)
        if records is not None:
            return rows.text_chunk(parts, records, tx)
    return rows.chunk(relation, batch, tx, first_seq)


async def import_snapshot(sql: SqlSession, snapshot: str) -> None:
    """A REPEATABLE READ transaction begun on ``sql`` that sees the exported ``snapshot``."""
    try:
        await sql.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        await sql.execute(f"SET TRANSACTION SNAPSHOT '{snapshot.replace(chr(39), '')}'")
    except asyncpg.PostgresError as exc:
        raise SourceError(f"cannot import snapshot {snapshot}: {exc}") from exc


async def close_session(sql: SqlSession) -> None:
    with trio.move_on_after(CLOSE_TIMEOUT) as scope:
        scope.shield = True
        await sql.close()


def _qualified(table: tuple[str, str]) -> str:
    return ".".join('"' + part.replace('"', '""') + '"' for part in table)


class ShapeCheck:
    """Whether a table's columns (``jobs.SHAPE``: names, types, modifiers; and partition
    parents) are still those of the catalog the initial snapshot was planned from
    (``before``: ``jobs.table_shapes``, read in the exported snapshot with that catalog).
    An ALTER TABLE that keeps the file (ADD, DROP or RENAME COLUMN,
    a wider varchar) is invisible to ``TableReader.rewritten``, but the snapshot's read
    would name the columns the catalog had. Asked once the reader holds the table's lock
    (no ALTER TABLE commits after it), in a session of its own: the reader's transaction
    sees the catalog as of its snapshot, not as it is now."""

    def __init__(self, dsn: str, before: dict):
        self.dsn, self.before = dsn, before
        self.sql: SqlSession | None = None
        self.lock = trio.Lock()  # one session for every reader

    async def changed(self, tables: tuple[tuple[str, str], ...]) -> bool:
        names = [_qualified(t) for t in tables]
        shapes = ", ".join(SHAPE.format(rel=f"to_regclass(${i}::text)") + f" as s{i}"
                           for i in range(1, len(names) + 1))
        try:
            async with self.lock:
                if self.sql is None:
                    self.sql = await SqlSession.connect(self.dsn)
                row = (await self.sql.fetch(f"select {shapes}", *names))[0]
        except asyncpg.PostgresError as exc:
            raise SourceError(f"snapshot reader failed reading the columns of "
                              f"{tables[0][0]}.{tables[0][1]}: {exc}") from exc
        return any(row[f"s{i}"] != self.before.get(t) or row[f"s{i}"] is None
                   for i, t in enumerate(tables, start=1))

    async def close(self) -> None:
        if self.sql is not None:
            await close_session(self.sql)


class session:
    """``async with session(dsn) as sql``: a ``SqlSession`` closed shielded."""

    def __init__(self, dsn: str):
        self.dsn = dsn

    async def __aenter__(self) -> SqlSession:
        self.sql = await SqlSession.connect(self.dsn)
        return self.sql

    async def __aexit__(self, *exc) -> None:
        await close_session(self.sql)
