"""Who answers for the replication slot a run created.

Rule: a slot retains WAL from its creation until it is dropped, whether anyone reads it or
not. A slot this process created and never streamed from is therefore dropped when the run
fails (bounded and shielded, like every cleanup); a slot that was streamed from, or that
existed before, is never touched: its confirmed position is the consumers' progress.
After a second signal every way the run ends is ``Aborted`` (what the abort broke is only
its echo).
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

import trio

from router.errors import Aborted

from ..services import log
from ..services import slots
from ..services.retry import only_cancelled
from ..services.sql import SqlSession

_log = log.get("supervisor")
DROP_TIMEOUT = 15.0


class SlotOwner:
    def __init__(self, dsn: str, slot: str):
        self.dsn = dsn
        self.slot = slot
        self.created = False  # by this process
        self.streamed = False

    async def drop_if_unused(self) -> None:
        if not self.created or self.streamed:
            return
        with trio.move_on_after(DROP_TIMEOUT) as scope:
            scope.shield = True
            try:
                async with await SqlSession.connect(self.dsn) as sql:
                    # the failed walsender may still be exiting
                    await slots.drop_when_inactive(sql, self.slot, lambda: trio.sleep(0.2))
                log.event(_log, "dropped the replication slot this run created", slot=self.slot)
                self.created = False
            except Exception as exc:  # noqa: BLE001 — best effort: the failure that brought
                # us here is what the user must see; this line says the slot is still there
                log.event(_log, "could not drop the replication slot this run created",
                          level=logging.WARNING, slot=self.slot, error=str(exc))


async def guarded(body: Callable[[], Awaitable[None]],
                  signals: Callable[[trio.CancelScope], Awaitable[None]], owner: SlotOwner,
                  aborted: Callable[[], bool]) -> None:
    """Runs ``body`` next to ``signals`` (which may cancel the scope it is given): a failure
    drops the slot ``owner`` created and never streamed from; after a second signal
    (``aborted()``) the run ends in ``Aborted``."""
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(signals, nursery.cancel_scope)
            try:
                await body()
            finally:
                nursery.cancel_scope.cancel()
        if aborted():
            raise Aborted()
    except BaseException as exc:
        if not only_cancelled(exc):
            await owner.drop_if_unused()
        if aborted() and not isinstance(exc, Aborted):
            raise Aborted() from None
        raise
