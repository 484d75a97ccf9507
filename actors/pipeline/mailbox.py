"""Channel item types shared by the actors, and ``Latest``: a one-slot mailbox that keeps
only the newest value (the flush LSN travelling back to the slot reader)."""

from __future__ import annotations

import msgspec
import trio

#: bounded channel sizes, in items (an item is a batch or a chunk, never a single message)
CHUNKS = 8
ACKS = 256


class WalBatch(msgspec.Struct):
    """Messages read from the walsender in one go, with the server's position when the
    reader found nothing more to read (``keepalive``)."""

    messages: list  # [(lsn, payload bytes)]
    keepalive: int | None = None


class Keepalive(msgspec.Struct, frozen=True):
    """The server's WAL position when the reader found nothing more to read."""

    lsn: int


class Hold(msgspec.Struct, frozen=True):
    """The cap on confirmation while a prepared transaction is held (``lsn``: the last
    LSN that may be confirmed; None: no cap), with the held transaction's ``gid`` and
    ``prepare_lsn`` for the operator."""

    lsn: int | None
    gid: str | None = None
    prepare_lsn: int | None = None


class Registered(msgspec.Struct, frozen=True):
    """Sink → confirmer: a transaction's records were handed to Kafka under ``ticket``;
    ``end_lsn`` may be confirmed once this ticket and every earlier one are acked."""

    ticket: int
    end_lsn: int


class Acked(msgspec.Struct, frozen=True):
    """Sink → confirmer: Kafka acknowledged every record (``records`` of them) of
    ``ticket``."""

    ticket: int
    records: int


class Latest:
    """Newest-value mailbox: ``set`` never blocks, ``wait_changed`` wakes on every set."""

    def __init__(self, value: int = 0):
        self.value = value
        self.closed = False
        self._event = trio.Event()

    def set(self, value: int) -> None:
        self.value = value
        self._event.set()
        self._event = trio.Event()

    def close(self) -> None:
        self.closed = True
        self._event.set()

    async def wait_changed(self) -> None:
        await self._event.wait()


class Inline:
    """A downstream actor run in its sender's task, in place of the channel to it: ``send``
    is the actor's ``handle``, closing is its ``end``. One task wake-up less per batch; the
    sender waits while the actor works, as it waits on a full channel."""

    __slots__ = ("send", "close")

    def __init__(self, actor):
        self.send = actor.handle
        self.close = actor.end

    def __enter__(self) -> "Inline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
