"""Delivery accounting between the sink and its Kafka client.

The client contract reports per batch, not per record: ``produce(records, ticket, on_done)``
calls ``on_done(ticket, None, len(records))`` once when Kafka acknowledged every record of
the batch, or ``on_done(ticket, error, 0)`` at the first failure, and nothing after that.
``Tally`` turns the clients' per-record callbacks into that: ``tally(err, msg)`` is
librdkafka's delivery callback, ``tally.ack(metadata)``/``tally.fail(exc)`` kafka-python's.

Rules:

* A Tally fires at most once. It is made for a batch before any record of it is handed over,
  so a record acknowledged at once cannot complete a batch too early.
* The per-record work is a decrement; in C (``router._native.Tally``) when it is built, as
  the client's thread runs it for every record.
"""

from __future__ import annotations

from .native import NATIVE


class PyTally:
    """``router._native.Tally`` in Python (the reference, and the fallback)."""

    __slots__ = ("count", "left", "fired", "on_done", "ticket")

    def __init__(self, count: int, on_done, ticket):
        if count < 0:
            raise ValueError("Tally: negative count")
        self.count = self.left = count
        self.fired = False
        self.on_done = on_done
        self.ticket = ticket

    def __call__(self, err, msg=None):
        if err is not None:
            return self.fail(err)
        return self.ack()

    def ack(self, *ignored):
        if self.fired:
            return
        self.left -= 1
        if self.left <= 0:
            self.fired = True
            self.on_done(self.ticket, None, self.count)

    def fail(self, err):
        if self.fired:
            return
        self.fired = True
        self.on_done(self.ticket, err, 0)


#: what clients use: the C Tally when built
Tally = NATIVE.Tally if NATIVE is not None else PyTally
