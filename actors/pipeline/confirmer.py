"""The confirm actor: durable acknowledgements in, the confirmed LSN out
(``router.delivery.confirmation``), plus the periodic progress log line and the
``--until-caught-up`` finish line.

``--until-caught-up`` is reached when the confirmed LSN reaches ``until_lsn``, or when a
prepared transaction (two-phase) caps confirmation below it and everything else up to
``until_lsn`` is durable in Kafka: waiting for COMMIT PREPARED could take forever, so the
run finishes and ``held`` names the transaction (its gid and prepare LSN); a later run
delivers it once it is committed.

A transaction counts as done only on the sink's ``Acked``, which it sends from Kafka's delivery
result; nothing here can change that rule (the fault tests' proof that they would catch a
broken rule injects the fault from the test side: tests/e2e/broken_router.py)."""

from __future__ import annotations

import time

import trio

from router.postgres.lsn import format_lsn
from router.delivery.confirmation import ConfirmationTracker

from ..services import log
from .mailbox import Registered, Acked, Hold, Keepalive, Latest

_log = log.get("progress")


class Stats:
    """Counters the actors bump and the progress log reads. All but ``acked_records`` are
    bumped on the trio thread; the sink bumps that one from the Kafka client's thread, under
    its lock, as acknowledged batches arrive (readers only need a recent value)."""

    def __init__(self):
        self.received_messages = 0
        self.received_lsn = 0
        self.server_lsn = 0
        self.sent_records = 0
        self.acked_records = 0


class ConfirmActor:
    def __init__(self, *, inbox: trio.MemoryReceiveChannel, confirmed: Latest, confirmed_lsn: int,
                 stats: Stats, interval: float = 10.0, until_lsn: int | None = None,
                 caught_up: trio.Event | None = None):
        self.inbox = inbox
        self.confirmed = confirmed
        self.tracker = ConfirmationTracker(confirmed_lsn)
        self.stats = stats
        self.interval = interval
        self.until_lsn = until_lsn
        self.caught_up = caught_up
        self._hold: Hold | None = None
        #: the Hold (gid, prepare LSN) that capped confirmation when caught up, if one did
        self.held: Hold | None = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        tracker = self.tracker
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._report)
                with self.inbox:
                    async for events in self.inbox:  # lists, in the sink's order
                        for ev in events:
                            kind = type(ev)
                            if kind is Registered:
                                tracker.begin(ev.ticket, ev.end_lsn)
                            elif kind is Acked:
                                tracker.done(ev.ticket)
                            elif kind is Keepalive:
                                tracker.keepalive(ev.lsn)
                            elif kind is Hold:
                                tracker.set_hold(ev.lsn)
                                self._hold = ev if ev.lsn is not None else None
                        if tracker.confirmed > self.confirmed.value:
                            self.confirmed.set(tracker.confirmed)
                        if self.until_lsn is not None and self.caught_up is not None:
                            self._check_caught_up()
                nursery.cancel_scope.cancel()
        finally:
            self.confirmed.close()
        self._line()

    def _check_caught_up(self) -> None:
        tracker, until = self.tracker, self.until_lsn
        if tracker.confirmed >= until:
            self.held = None
            self.caught_up.set()
        elif (self._hold is not None and tracker.hold is not None
              and tracker.delivered >= until and not tracker.in_flight):
            self.held = self._hold
            self.caught_up.set()

    async def _report(self) -> None:
        while True:
            await trio.sleep(self.interval)
            self._line()

    _last = (0.0, 0)

    def _line(self) -> None:
        now = time.monotonic()
        then, acked_then = self._last
        rate = (self.stats.acked_records - acked_then) / (now - then) if then else 0.0
        self._last = (now, self.stats.acked_records)
        server = max(self.stats.server_lsn, self.stats.received_lsn)
        log.event(_log, "progress", received_lsn=format_lsn(self.stats.received_lsn),
                  confirmed_lsn=format_lsn(self.tracker.confirmed),
                  lag_bytes=max(0, server - self.tracker.confirmed),
                  records_acked=self.stats.acked_records, records_per_s=round(rate, 1),
                  in_flight=self.tracker.in_flight)
