"""The router actor: committed transactions in, Kafka-ready record chunks out, route by
route (``router.routing.change_router``). Keepalives and holds pass through in order.
A large transaction may come in parts (``Transaction.partial``: ``router.stream.transactions``),
each routed as it comes; only the chunks of the part Commit released end it (``last``).

Origin filtering (``actors.pipeline.origin_filter``) arrives as ``FilteredTransaction`` (an empty
final chunk: nothing is published, the end LSN is still registered and confirmed in order)
and ``RestrictedTransaction`` (routed by a router holding only the routes that publish it;
``router_for`` builds one per route set). ``RoutedChunk``s in the inbox (a backfill's chunk
records, ``actors.snapshot.backfill``) pass on in order. With ``meta`` (``router.routing.transaction_meta``) every
transaction that produces records gets BEGIN/END records in its own chunks.

Items go out as lists: everything one incoming batch of events produced, cut whenever
``CHUNK_RECORDS`` records have gathered or routing the batch has taken ``CUT_SECONDS``, so a
stream of small transactions costs one channel send per batch rather than one per
transaction, and the first transactions of a large batch (a backlog after a pause) reach
the sink while the rest is routed instead of waiting for all of it. The actor runs in its
own task (``run``) or in its sender's (``handle`` and ``end`` behind ``mailbox.Inline``)."""

from __future__ import annotations

from time import perf_counter

import trio

from router.stream.origins import FilteredTransaction, RestrictedTransaction
from router.routing.change_router import CHUNK_RECORDS, ChangeRouter, RoutedChunk
from router.stream.transactions import NonTransactionalMessage, Transaction

from .mailbox import Hold, Keepalive


#: changes a transaction has at most to be routed by ``ChangeRouter.route_short``
SHORT = 64
#: seconds of routing after which what one batch produced so far is sent on (latency: a
#: backlog of one-row transactions is a batch of up to 2,000 messages)
CUT_SECONDS = 0.004


class RouterActor:
    def __init__(self, *, router: ChangeRouter, inbox: trio.MemoryReceiveChannel,
                 out: trio.MemorySendChannel, router_for=None, meta=None, metrics=None,
                 signals=None):
        self.router = router
        #: ``actors.snapshot.signals.on_signals`` bound to the backfill actor, or None
        self.signals = signals
        self.inbox = inbox
        self.out = out
        self.router_for = router_for  # frozenset of route names -> ChangeRouter
        self.meta = meta  # router.routing.transaction_meta.TransactionMeta or None
        self._subsets: dict[frozenset, ChangeRouter] = {}
        self.metrics = metrics  # actors.services.metrics.Metrics or None
        self._route_all = router.route if meta is None else (
            lambda txn: self._route(txn, self.router))
        # short transactions in one step (ChangeRouter.route_short), unless each one also
        # gets a transaction record (meta)
        self._short = router.route_short if meta is None else None

    def _route(self, txn: Transaction, router: ChangeRouter):
        chunks = router.route(txn)
        return chunks if self.meta is None else self.meta.wrap(txn, chunks)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        with self.inbox, self.out:
            async for events in self.inbox:
                await self.handle(events)

    def end(self) -> None:
        """No more events (run in its sender's task: ``mailbox.Inline``)."""
        self.out.close()

    async def handle(self, events: list) -> None:
        """One incoming batch of events routed and sent on."""
        route, short, metrics = self._route_all, self._short, self.metrics
        group: list = []
        size = 0
        started, waited = perf_counter(), 0.0
        cut = started + CUT_SECONDS
        for ev in events:
            kind = type(ev)
            if kind is Transaction and ev.change_count <= SHORT and short is not None:
                chunk = short(ev)  # one chunk, or None: the long way below
                if chunk is not None:
                    group.append(chunk)
                    size += len(chunk.records)
                    ev.changes.close()
                    if metrics is not None:
                        metrics.routed(ev.end_lsn, ev.commit_time, ev.change_count)
                    if size >= CHUNK_RECORDS or perf_counter() > cut:
                        sent = perf_counter()
                        await self.out.send(group)
                        waited += perf_counter() - sent
                        group, size = [], 0
                        cut = perf_counter() + CUT_SECONDS
                    continue
            if kind is Transaction or kind is RestrictedTransaction:
                txn = ev if kind is Transaction else ev.transaction
                used = self.router if kind is Transaction else self._subset(ev.routes)
                chunks = route(txn) if kind is Transaction else self._route(txn, used)
                try:
                    for chunk in chunks:
                        if chunk.last and used.signals:  # recorded before it can be confirmed
                            await self.signals(used.take_signals())
                        group.append(chunk)
                        size += len(chunk.records)
                        if size >= CHUNK_RECORDS:
                            sent = perf_counter()  # time waiting is not routing
                            await self.out.send(group)
                            waited += perf_counter() - sent
                            group, size = [], 0
                finally:
                    txn.changes.close()
                if metrics is None:
                    pass
                elif txn.partial:  # a part of a transaction still arriving
                    metrics.changes.inc(txn.change_count)
                else:
                    metrics.routed(txn.end_lsn, txn.commit_time, txn.change_count)
            elif kind is NonTransactionalMessage:
                group.append(self.router.route_message(ev))
            elif kind is Keepalive or kind is Hold:
                group.append(ev)
            elif kind is RoutedChunk:  # routed already (backfill chunk records)
                group.append(ev)
                size += len(ev.records)
            elif kind is FilteredTransaction:
                group.append(RoutedChunk(ev.xid, ev.commit_lsn, ev.end_lsn, [], [], True))
                if metrics is not None:
                    metrics.origin_dropped.inc()
            # PreparedOutcome (prepare mode): nothing to publish
        if metrics is not None:
            metrics.stage_seconds.labels("route").observe(perf_counter() - started - waited)
            for router in (self.router, *self._subsets.values()):
                if router.dropped:
                    for name, n in router.take_dropped().items():
                        metrics.route_dropped.labels(name).inc(n)
        if group:
            await self.out.send(group)

    def _subset(self, routes: frozenset) -> ChangeRouter:
        sub = self._subsets.get(routes)
        if sub is None:
            sub = self._subsets[routes] = self.router_for(routes)
        return sub


class TypeNames:
    """``dict.get``-like view of the relation cache's type names (for schema records)."""

    def __init__(self, relations):
        self._relations = relations

    def get(self, oid: int, default=None):
        return self._relations.type_name(oid) or default
