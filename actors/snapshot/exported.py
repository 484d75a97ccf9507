"""The slot of an initial snapshot, created with an exported snapshot.

Rules:

* The slot is created on a replication connection with ``SNAPSHOT 'export'``: its
  consistent point and the exported snapshot describe the same instant — every
  transaction committed before it is in the snapshot, every later one is streamed.
* That connection stays open (and idle) until every reader imported the snapshot and
  finished (``close``): the snapshot lives as long as the connection that exported it.
* That connection is named (``application_name``, ``copy_name``): the slot shows as free
  until the copy is in Kafka and the stream starts, and a second router on the same
  config must see that the first is still copying (``actors.runner.source.wait_slot_free``)
  rather than register the transactional id, which fences the copy.
* A slot of that name created by someone else is ``SlotInUse``; a server that cannot be
  reached is ``SourceUnavailable``; any other refusal is ``SourceError`` (one line each).
"""

from __future__ import annotations

import hashlib

import psycopg2
import psycopg2.errors
import psycopg2.extras

from router.errors import SlotInUse, SourceError, SourceUnavailable
from router.lsn import parse_lsn


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
    """A slot created with an exported snapshot, on a replication connection kept open."""

    def __init__(self, dsn: str, slot: str, two_phase: bool, failover: bool = False):
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
