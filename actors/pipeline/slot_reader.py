"""The slot reader: the walsender stream of one logical replication slot.

psycopg2's ``LogicalReplicationConnection`` in async mode, waited on with
``trio.lowlevel.wait_readable`` (asyncpg has no CopyBoth support; no threads). Rules:

* Messages are read in batches as long as the socket has data and sent downstream as one
  ``WalBatch`` (to the decoder's ``handle``, run in this task: ``mailbox.Inline``; the
  standby status loop is a task of its own, so it answers while a batch is routed); when
  nothing more is buffered, the batch carries the server's position
  (``cursor.wal_end``) as a keepalive candidate — in band, so it is confirmed only after
  everything read before it.
* Keepalives that ask for a reply are answered by psycopg2 inside ``read_message`` with the
  confirmed position we last gave it (the status update's flush field). Standby status
  updates carry the confirmed LSN from the confirm actor, sent when it moves (at most every
  ``STATUS_MIN_GAP`` seconds, so a stream of small transactions is confirmed in batches, not
  one update per commit) and at least every ``status_interval`` seconds; when idle they ask
  the server for a keepalive, so quiet slots confirm recent positions.
* With ``[ha]`` (``holds``) no status update is sent once the leadership lease is not held:
  the reader fails with ``LeadershipLost`` instead (router.delivery.ha).
* Draining: ``stop_reading()`` ends the read loop and closes its output; the
  connection stays open until the confirm actor closes the confirmed mailbox, so the
  final confirmed position is sent before the connection closes.
"""

from __future__ import annotations

import time

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras
import trio

from router.errors import LeadershipLost, PublicationMissing, SlotInUse, SlotMissing, SourceError, SourceUnavailable
from router.postgres.identifiers import publication_names, start_replication
from router.postgres.lsn import format_lsn
from router.native import NATIVE

from ..services import log
from .mailbox import Latest, WalBatch

MAX_BATCH_MESSAGES = 2000
MAX_BATCH_BYTES = 8 * 1024 * 1024
STATUS_MIN_GAP = 0.02
_log = log.get("slot")


def source_error(exc: psycopg2.Error, *, streaming: bool) -> SourceError:
    """Map a psycopg2 error to the router's tree (by SQLSTATE class, never by text)."""
    if isinstance(exc, psycopg2.errors.ObjectInUse):
        return SlotInUse(f"replication slot is in use by another process: {exc}".strip())
    if isinstance(exc, psycopg2.errors.UndefinedObject):
        if streaming:
            return PublicationMissing(f"{exc}".strip())
        return SlotMissing(f"{exc}".strip())
    if isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)):
        return SourceUnavailable(f"walsender connection failed: {exc}".strip())
    code = getattr(exc, "pgcode", None)
    if code is None or code.startswith(("08", "57")):
        # no SQLSTATE: the connection itself ended (e.g. "no COPY in progress" after the
        # server shut down); 08 connection exceptions, 57 operator intervention (shutdown)
        return SourceUnavailable(f"walsender connection lost: {exc}".strip())
    return SourceError(f"walsender error: {exc}".strip())


def pgoutput_options(*, proto_version: int, publications: list[str], streaming: bool,
                     messages: bool, binary: bool, two_phase: bool,
                     origin: str | None = None) -> dict[str, str]:
    opts = {"proto_version": str(proto_version),
            "publication_names": publication_names(publications)}
    if messages:
        opts["messages"] = "true"
    if binary:
        opts["binary"] = "true"
    if streaming and proto_version >= 2:
        opts["streaming"] = "parallel" if proto_version >= 4 else "on"
    if two_phase and proto_version >= 3:
        opts["two_phase"] = "on"
    if origin is not None:
        opts["origin"] = origin
    return opts


async def _poll(conn) -> None:
    while True:
        state = conn.poll()
        if state == psycopg2.extensions.POLL_OK:
            return
        if state == psycopg2.extensions.POLL_READ:
            await trio.lowlevel.wait_readable(conn.fileno())
        elif state == psycopg2.extensions.POLL_WRITE:
            await trio.lowlevel.wait_writable(conn.fileno())


def _drain_py(read_message, max_messages: int, max_bytes: int) -> tuple[list, bool]:
    """``router._native.drain`` in Python: (data_start, payload) pairs read until the
    connection has nothing buffered (exhausted) or the batch is full."""
    batch: list = []
    size = 0
    while len(batch) < max_messages and size < max_bytes:
        msg = read_message()
        if msg is None:
            return batch, True
        payload = msg.payload
        batch.append((msg.data_start, payload))
        size += len(payload)
    return batch, False


drain = NATIVE.drain if NATIVE is not None else _drain_py


class SlotReader:
    def __init__(self, *, dsn: str, slot: str, options: dict[str, str],
                 out, confirmed: Latest, status_interval: float = 2.0,
                 stats=None, holds=None):
        self.dsn = dsn
        self.slot = slot
        self.options = options
        self.out = out
        self.confirmed = confirmed
        self.status_interval = status_interval
        self.stats = stats
        #: with ``[ha]``: ``Leadership.holds``, asked before every status update
        #: (router.delivery.ha)
        self.holds = holds
        self._stop = trio.Event()
        self._waiting: trio.CancelScope | None = None  # the read loop's wait for the socket
        self._conn = None
        self._cur = None
        self._last_status = 0.0
        self._sent_confirmed = 0
        self._streaming = False

    def stop_reading(self) -> None:
        self._stop.set()
        if self._waiting is not None:  # the read loop waits for the socket: end the wait
            self._waiting.cancel()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            self._conn = psycopg2.connect(
                self.dsn, async_=True, application_name="pgrouter",
                connection_factory=psycopg2.extras.LogicalReplicationConnection)
            await _poll(self._conn)
            self._cur = self._conn.cursor()
            # the command built here: psycopg2's start_replication quotes the options as
            # Latin-1 (router.postgres.identifiers)
            self._cur.start_replication_expert(
                start_replication(self.slot, format_lsn(0), self.options), decode=False)
            await _poll(self._conn)
            self._streaming = True
            log.event(_log, "streaming started", slot=self.slot,
                      proto_version=self.options["proto_version"])
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._guarded, self._read_loop)
                nursery.start_soon(self._guarded, self._status_loop)
        except psycopg2.Error as exc:
            raise source_error(exc, streaming=self._streaming) from exc
        finally:
            if self._conn is not None:
                self._conn.close()

    async def _guarded(self, loop) -> None:
        try:
            await loop()
        except psycopg2.Error as exc:
            raise source_error(exc, streaming=True) from exc

    async def _read_loop(self) -> None:
        cur = self._cur
        fd = self._conn.fileno()
        last_marker = 0
        stats = self.stats
        with self.out:
            while not self._stop.is_set():
                batch, exhausted = drain(cur.read_message, MAX_BATCH_MESSAGES,
                                         MAX_BATCH_BYTES)
                if batch:
                    if stats is not None:
                        stats.received_lsn = batch[-1][0]
                        stats.received_messages += len(batch)
                    wal_end = cur.wal_end
                    marked = exhausted and wal_end > batch[-1][0]
                    # the batch carries the server's end (or passes it): no marker follows
                    last_marker = max(last_marker, wal_end if marked else batch[-1][0])
                    await self.out.send(WalBatch(batch, wal_end if marked else None))
                    continue
                wal_end = cur.wal_end
                if wal_end > last_marker:
                    last_marker = wal_end
                    if stats is not None:
                        stats.server_lsn = max(stats.server_lsn, wal_end)
                    await self.out.send(WalBatch([], wal_end))
                # one cancel scope, no task: ``stop_reading`` cancels it (a trickle of
                # transactions waits here once each)
                with trio.move_on_after(self.status_interval / 2) as self._waiting:
                    if not self._stop.is_set():
                        await trio.lowlevel.wait_readable(fd)
                self._waiting = None

    async def _status_loop(self) -> None:
        """Send standby status updates until the confirm actor closes the mailbox."""
        while True:
            with trio.move_on_after(self.status_interval):
                await self.confirmed.wait_changed()
            gap = self._last_status + STATUS_MIN_GAP - time.monotonic()
            if gap > 0 and not self.confirmed.closed and not self._stop.is_set():
                await trio.sleep(gap)  # let more confirmations arrive: one update for all
            idle = self._stop.is_set() or (time.monotonic() - self._last_status) >= self.status_interval
            self._send_status(force=idle, reply=idle and not self._stop.is_set())
            if self.confirmed.closed:
                self._send_status(force=True, reply=False)
                log.event(_log, "final confirmed position sent", slot=self.slot,
                          confirmed_lsn=format_lsn(self._sent_confirmed))
                return

    def _send_status(self, *, force: bool, reply: bool) -> None:
        lsn = self.confirmed.value
        if not force and lsn <= self._sent_confirmed:
            return
        if self.holds is not None and not self.holds():
            raise LeadershipLost("leadership lost: the slot is not confirmed any further")
        try:
            self._cur.send_feedback(write_lsn=lsn, flush_lsn=lsn, apply_lsn=lsn, reply=reply,
                                    force=True)
        except psycopg2.Error as exc:
            raise source_error(exc, streaming=True) from exc
        self._sent_confirmed = max(self._sent_confirmed, lsn)
        self._last_status = time.monotonic()
