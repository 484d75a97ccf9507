"""Reading table rows with ``COPY (SELECT …) TO STDOUT`` in a worker thread.

Rules:

* One psycopg2 connection per reader, used by one thread at a time. Rows arrive as COPY
  text (the types' output functions: what pgoutput sends in text mode) and are parsed by
  ``router.snapshot``; they are handed to trio in batches of ``BATCH_ROWS`` through a
  bounded channel, so a table of any size holds at most a few batches in memory and a slow
  Kafka slows the COPY down (the server waits on the socket).
* Sessions keep the server's defaults (TimeZone, DateStyle, extra_float_digits), as the
  walsender session does, so a value reads the same in a snapshot row and in a change.
* The snapshot a reader sees is its caller's business: ``import_snapshot`` opens a
  REPEATABLE READ transaction on an exported snapshot (the initial snapshot), otherwise each
  read is its own statement (a backfill chunk).
* PostgreSQL errors become ``SourceError``s naming the table; a lost connection is
  ``SourceUnavailable`` (the supervisor retries).
"""

from __future__ import annotations

import psycopg2
import trio

from router.errors import SourceError, SourceUnavailable
from router.snapshot import parse_copy_data

#: rows handed to trio at a time
BATCH_ROWS = 2000


def _error(exc: psycopg2.Error, what: str) -> SourceError:
    if isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)):
        return SourceUnavailable(f"snapshot reader lost PostgreSQL while {what}: {exc}".strip())
    return SourceError(f"snapshot reader failed while {what}: {exc}".strip())


class _Rows:
    """The file psycopg2's ``copy_expert`` writes to: one call per row."""

    def __init__(self, deliver, batch_rows: int):
        self.buf: list[bytes] = []
        self.deliver = deliver
        self.batch_rows = batch_rows
        self.rows = 0

    def write(self, data) -> None:
        self.buf.append(data if type(data) is bytes else data.encode())
        if len(self.buf) >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        if self.buf:
            rows = parse_copy_data(b"".join(self.buf).decode())
            self.buf = []
            self.rows += len(rows)
            self.deliver(rows)


class TableReader:
    """A blocking reader; every method runs in a worker thread."""

    def __init__(self, dsn: str):
        try:
            self.conn = psycopg2.connect(dsn, application_name="pgrouter-snapshot")
        except psycopg2.Error as exc:
            raise _error(exc, "connecting") from exc
        self.conn.set_client_encoding("UTF8")
        self.conn.autocommit = True  # transactions are explicit (import_snapshot) or one COPY

    def import_snapshot(self, snapshot: str) -> None:
        try:
            with self.conn.cursor() as cur:
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
        except psycopg2.Error as exc:
            raise _error(exc, f"importing snapshot {snapshot}") from exc

    def estimate(self, table: tuple[str, str]) -> int:
        """Rows of the table as the planner's statistics say (0 when never analyzed)."""
        with self.conn.cursor() as cur:
            cur.execute("select greatest(reltuples, 0)::int8 from pg_class c join pg_namespace"
                        " n on n.oid = c.relnamespace where n.nspname = %s and c.relname = %s",
                        table)
            row = cur.fetchone()
        return int(row[0]) if row else 0

    def copy(self, select: str, deliver, what: str, batch_rows: int = BATCH_ROWS,
             params: tuple | None = None) -> int:
        """Runs ``COPY (select) TO STDOUT`` (``params`` bound into ``select``, which then
        has every literal ``%`` doubled);
        ``deliver(rows)`` gets the rows in batches. Returns the number of rows."""
        sink = _Rows(deliver, batch_rows)
        try:
            with self.conn.cursor() as cur:
                if params is not None:
                    select = cur.mogrify(select, params).decode()
                cur.copy_expert(f"COPY ({select}) TO STDOUT", sink)
        except psycopg2.Error as exc:
            raise _error(exc, what) from exc
        sink.flush()
        return sink.rows

    def close(self) -> None:
        try:
            self.conn.close()
        except psycopg2.Error:
            pass


async def open_reader(dsn: str) -> TableReader:
    return await trio.to_thread.run_sync(TableReader, dsn)
