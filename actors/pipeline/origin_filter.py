"""The origin filter actor: between the decoder and the router, drops transactions by the
replication origin they came from (``router.stream.origins``).

Receives the decoder's event lists (``Transaction``, ``NonTransactionalMessage``,
``Keepalive``, ``Hold``) and passes each list on, in order, with every transaction replaced
according to ``OriginRules.decide``:

* published by every route → passed as it is;
* by no route → a ``FilteredTransaction`` (its changes are released here), so the router actor
  still registers its end LSN and the slot confirms past it in commit order; a part of a
  transaction released before its Commit (``Transaction.partial``) is dropped, its end is
  the last part's;
* by some routes only (per-route overrides) → a ``RestrictedTransaction`` naming them.

Everything else passes untouched. Counts of dropped transactions go to the log at the end
and with every ``LOG_EVERY`` dropped transactions.
"""

from __future__ import annotations

import trio

from router.stream.origins import (
    ALL_ROUTES, NO_ROUTE, FilteredTransaction, OriginRules, RestrictedTransaction)
from router.stream.transactions import Transaction

from ..services import log

_log = log.get("origin_filter")
LOG_EVERY = 10_000


class OriginFilterActor:
    def __init__(self, *, rules: OriginRules, inbox: trio.MemoryReceiveChannel,
                 out: trio.MemorySendChannel):
        self.rules = rules
        self.inbox = inbox
        self.out = out
        self.passed = 0
        self.dropped = 0
        self.restricted = 0

    def filter(self, events: list) -> list:
        """The event list with every transaction replaced by what the rules decide."""
        decide = self.rules.decide
        gaps = False  # parts dropped: their places to close
        for i, ev in enumerate(events):
            if type(ev) is not Transaction:
                continue
            decision = decide(ev.origin_name)
            if decision is ALL_ROUTES:
                self.passed += not ev.partial
                continue
            if decision is NO_ROUTE:
                ev.changes.close()
                if ev.partial:
                    events[i], gaps = None, True
                    continue
                events[i] = FilteredTransaction(ev.xid, ev.commit_lsn, ev.end_lsn, ev.origin_name)
                self.dropped += 1
                if self.dropped % LOG_EVERY == 0:
                    self._report()
            else:
                events[i] = RestrictedTransaction(ev, decision)
                self.restricted += not ev.partial
        return [ev for ev in events if ev is not None] if gaps else events

    def _report(self) -> None:
        log.event(_log, "origin filter", passed=self.passed, dropped=self.dropped,
                  restricted=self.restricted)

    def start(self) -> None:
        log.event(_log, "filtering by origin", **self.rules.describe())

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.start()
        task_status.started()
        filt = self.filter
        try:
            with self.inbox, self.out:
                async for events in self.inbox:
                    await self.out.send(filt(events))
        finally:
            self._report()

    async def handle(self, events: list) -> None:
        """One batch filtered and sent on (run in its sender's task: ``mailbox.Inline``)."""
        await self.out.send(self.filter(events))

    def end(self) -> None:
        try:
            self.out.close()
        finally:
            self._report()
