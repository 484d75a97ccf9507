"""Which LSN may be confirmed to PostgreSQL: the flush-position rule.

Rules (docs/architecture.md "The pipeline of `pgrouter run`", docs/delivery.md):

* Transactions are registered in commit order with their end LSN. The flush LSN moves to a
  transaction's end LSN only when every record of it *and of every earlier transaction* has
  been acknowledged by Kafka (on every topic it went to — one counter per transaction covers
  all topics, so the position is the minimum over topics).
* A transaction produced in parts is registered at its first record, before its end LSN is
  known, and registered again with it at its last: not done before that.
* A transaction with no records (everything filtered out) is done as soon as it is sealed,
  but still waits for the earlier ones.
* A keepalive position enters the same queue: it is confirmed once everything before it is
  done, so the slot does not retain WAL while the published tables are quiet.
* ``hold`` caps every confirmation: the earliest LSN of data the pipeline holds but has not
  delivered (a prepared transaction waiting for COMMIT PREPARED). Confirming past it would
  make PostgreSQL skip that data after a restart.
* The confirmed LSN never moves backwards.
* ``delivered`` is where confirmation would be without ``hold``: everything registered up
  to it is durable. ``--until-caught-up`` reads it to finish while a prepared transaction is
  held (confirmation itself stays capped).
"""

from __future__ import annotations

from collections import deque


class _Entry:
    __slots__ = ("lsn", "done")

    def __init__(self, lsn: int, done: bool):
        self.lsn = lsn
        self.done = done


class ConfirmationTracker:
    """The sink names each transaction with a ticket (any hashable, unique while in flight)
    and registers it with ``begin`` in commit order; it calls ``done`` once Kafka
    acknowledged every record of the transaction (it counts records itself)."""

    def __init__(self, start_lsn: int = 0):
        self._queue: deque[_Entry] = deque()
        self._by_ticket: dict[object, _Entry] = {}
        self.confirmed = start_lsn
        self.delivered = start_lsn
        self.hold: int | None = None

    def begin(self, ticket: object, end_lsn: int) -> None:
        """Register a transaction, in commit order. A ticket registered again (a transaction
        produced in parts, registered before its end LSN was known) gets the later end."""
        entry = self._by_ticket.get(ticket)
        if entry is not None:
            entry.lsn = max(entry.lsn, end_lsn)
            return
        entry = _Entry(end_lsn, done=False)
        self._queue.append(entry)
        self._by_ticket[ticket] = entry

    def done(self, ticket: object) -> None:
        """Every record of the ticket's transaction is durable in Kafka."""
        self._by_ticket.pop(ticket).done = True
        self._advance()

    def keepalive(self, lsn: int) -> None:
        """A position with nothing behind it but what is already registered."""
        self._queue.append(_Entry(lsn, done=True))
        self._advance()

    def set_hold(self, lsn: int | None) -> None:
        self.hold = lsn
        self._advance()

    @property
    def in_flight(self) -> int:
        """Registered transactions not yet durable."""
        return len(self._by_ticket)

    def _advance(self) -> None:
        q = self._queue
        best = self.confirmed
        while q and q[0].done:
            lsn = q.popleft().lsn
            if lsn > best:
                best = lsn
        if best > self.delivered:
            self.delivered = best
        if self.hold is not None and best > self.hold:
            best = max(self.confirmed, self.hold)
        self.confirmed = best
