"""The position ``pgrouter verify`` compares at: a snapshot of the source whose LSN is known,
and the wait until the router delivered every transaction before it.

Rules:

* ``VerifyPoint`` creates a TEMPORARY logical slot with ``SNAPSHOT 'export'`` on a
  replication connection: its consistent point and the exported snapshot are one instant —
  a transaction committed before the point is in the snapshot, a later one is not. A reader
  imports the snapshot (``SET TRANSACTION SNAPSHOT``), then the connection is closed, which
  drops the slot: verify never holds WAL back beyond its own snapshot, and never touches the
  router's slot.
* ``wait_delivered``: the router confirms a position to its slot only after Kafka holds every
  record before it, so once the slot's ``confirmed_flush_lsn`` reaches the point, the topics
  hold every record of the snapshot. An inactive slot behind the point (the router stopped)
  is said in one line after ``IDLE_GRACE`` seconds; a timeout is one line too.
* ``wal_end``: the source's WAL end, read once a topic's end offsets are taken: a record
  whose commit LSN is past it was not written by the router (``router.verify.fold.TopicFold``).
"""

from __future__ import annotations

import psycopg2
import trio

from router.errors import SlotMissing, SourceError, SourceUnavailable
from router.postgres.lsn import format_lsn, parse_lsn

from ..services import slots
from ..services.sql import SqlSession

#: seconds an inactive router slot may stay behind the point before verify gives up
IDLE_GRACE = 5.0
POLL = 0.2


class VerifyPoint:
    """A temporary slot created with an exported snapshot (blocking: a worker thread's)."""

    def __init__(self, dsn: str, name: str):
        try:
            self.conn, self.lsn, self.snapshot = slots.export_slot(dsn, name, temporary=True)
        except (psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
            raise SourceUnavailable(f"source.dsn: cannot open a replication connection for "
                                    f"the verify snapshot: {exc}".strip()) from exc
        except psycopg2.Error as exc:
            raise SourceError(f"cannot create the temporary slot of the verify snapshot: "
                              f"{exc}".strip()) from exc

    def close(self) -> None:
        try:
            self.conn.close()
        except psycopg2.Error:
            pass


def wal_end(dsn: str) -> int:
    """The source's WAL end now (blocking): the insert position of a primary, the replayed one
    of a standby. Every commit the router decoded so far is at or below it."""
    try:
        conn = psycopg2.connect(dsn)
    except psycopg2.Error as exc:
        raise SourceUnavailable(f"source.dsn: cannot read the WAL end for verify: "
                                f"{exc}".strip()) from exc
    try:
        with conn.cursor() as cur:
            cur.execute("select (case when pg_is_in_recovery() then pg_last_wal_replay_lsn() "
                        "else pg_current_wal_insert_lsn() end)::text")
            return parse_lsn(cur.fetchone()[0])
    except psycopg2.Error as exc:
        raise SourceError(f"verify: reading the WAL end failed: {exc}".strip()) from exc
    finally:
        conn.close()


async def wait_delivered(sql: SqlSession, slot: str, lsn: int, timeout: float,
                         progress=None) -> int:
    """Returns the router slot's confirmed position once it is at or past ``lsn``."""
    idle_since = None
    with trio.move_on_after(timeout):
        while True:
            row = await slots.row(sql, slot)
            if row is None:
                raise SlotMissing(f"source.slot: replication slot {slot!r} does not exist: "
                                  "verify compares what the router delivered (start it)")
            confirmed = parse_lsn(row["lsn"]) if row["lsn"] else 0
            if confirmed >= lsn:
                return confirmed
            if not row["active"]:
                idle_since = idle_since or trio.current_time()
                if trio.current_time() - idle_since > IDLE_GRACE:
                    raise SourceError(
                        f"the router is not running: slot {slot!r} is inactive and has "
                        f"confirmed {format_lsn(confirmed)}, behind the verify point "
                        f"{format_lsn(lsn)}: start the router (pgrouter run) and verify "
                        "again")
            else:
                idle_since = None
            if progress is not None:
                progress(confirmed)
            await trio.sleep(POLL)
    raise SourceError(f"timed out after {timeout:g} s waiting for the router to deliver up "
                      f"to the verify point {format_lsn(lsn)} (slot {slot!r}): is it keeping "
                      "up? (--wait N)")
