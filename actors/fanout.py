"""The router actor: committed transactions in, Kafka-ready record chunks out, route by
route (``router.routing``). Keepalives and holds pass through in order.

Origin filtering (``actors.origin_filter``) arrives as ``FilteredTransaction`` (an empty
final chunk: nothing is published, the end LSN is still registered and confirmed in order)
and ``RestrictedTransaction`` (routed by a router holding only the routes that publish it;
``router_for`` builds one per route set). With ``meta`` (``router.transaction_meta``) every
transaction that produces records gets BEGIN/END records in its own chunks."""

from __future__ import annotations

import trio

from router.origins import FilteredTransaction, RestrictedTransaction
from router.routing import ChangeRouter, RoutedChunk
from router.transactions import NonTransactionalMessage, Transaction

from .mailbox import Hold, Keepalive


class FanoutActor:
    def __init__(self, *, router: ChangeRouter, inbox: trio.MemoryReceiveChannel,
                 out: trio.MemorySendChannel, router_for=None, meta=None):
        self.router = router
        self.inbox = inbox
        self.out = out
        self.router_for = router_for  # frozenset of route names -> ChangeRouter
        self.meta = meta  # router.transaction_meta.TransactionMeta or None
        self._subsets: dict[frozenset, ChangeRouter] = {}

    def _route(self, txn: Transaction, router: ChangeRouter):
        chunks = router.route(txn)
        return chunks if self.meta is None else self.meta.wrap(txn, chunks)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        route = self.router.route if self.meta is None else (
            lambda txn: self._route(txn, self.router))
        task_status.started()
        async with self.inbox, self.out:
            async for events in self.inbox:
                for ev in events:
                    if type(ev) is Transaction:
                        try:
                            for chunk in route(ev):
                                await self.out.send(chunk)
                        finally:
                            ev.changes.close()
                    elif type(ev) is NonTransactionalMessage:
                        await self.out.send(self.router.route_message(ev))
                    elif type(ev) in (Keepalive, Hold):
                        await self.out.send(ev)
                    elif type(ev) is FilteredTransaction:
                        await self.out.send(RoutedChunk(ev.xid, ev.commit_lsn, ev.end_lsn, [],
                                                        [], True))
                    elif type(ev) is RestrictedTransaction:
                        txn = ev.transaction
                        sub = self._subsets.get(ev.routes)
                        if sub is None:
                            sub = self._subsets[ev.routes] = self.router_for(ev.routes)
                        try:
                            for chunk in self._route(txn, sub):
                                await self.out.send(chunk)
                        finally:
                            txn.changes.close()
                    else:  # PreparedOutcome in prepare mode: nothing to publish
                        continue
