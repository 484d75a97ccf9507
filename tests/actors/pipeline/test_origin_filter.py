"""The origin filter actor and the router actor's handling of what it forwards: dropped
transactions still register their end LSN (an empty final chunk), restricted ones are routed
only by the routes that publish them, everything else passes in order."""

from __future__ import annotations

import json

import trio

from actors.pipeline.router_actor import RouterActor
from actors.pipeline.mailbox import Hold, Keepalive
from actors.pipeline.origin_filter import OriginFilterActor
from router.stream.origins import (
    ANY_POLICY, NONE_POLICY, FilteredTransaction, OriginPolicy, OriginRules,
    RestrictedTransaction,
)
from router.pgoutput import Begin, Commit, Insert, Origin, Relation, RelationColumn
from router.stream.relations import RelationCache
from router.routing.change_router import ChangeRouter, RoutedChunk, RouteSpec
from router.routing.transaction_meta import TransactionMeta
from router.stream.transactions import Transaction, TransactionAssembler

COLS = (RelationColumn(1, "id", 23, -1), RelationColumn(0, "v", 25, -1))
REL = Relation(100, "public", "t", "d", COLS)
SPECS = [RouteSpec("local", tables=frozenset({("public", "t")})),
         RouteSpec("all", tables=frozenset({("public", "t")}))]


def txn(n: int, origin: str | None, lsn: int) -> Transaction:
    a = TransactionAssembler(RelationCache())
    a.feed(1, REL)
    a.feed(lsn, Begin(lsn + 50, 7, lsn))
    if origin:
        a.feed(lsn + 1, Origin(0x55, origin))
    for i in range(n):
        a.feed(lsn + 2 + i, Insert(100, (str(i), f"v{i}")))
    (t,) = a.feed(lsn + 40, Commit(0, lsn + 50, lsn + 60, 7))
    return t


def test_filter_replaces_transactions_in_place():
    rules = OriginRules(NONE_POLICY, {"local": None, "all": ANY_POLICY})
    actor = OriginFilterActor(rules=rules, inbox=None, out=None)
    events = [txn(1, None, 100), Keepalive(5), txn(2, "node_b", 200), Hold(None)]
    out = actor.filter(events)
    assert type(out[0]) is Transaction and out[1] == Keepalive(5) and out[3] == Hold(None)
    assert type(out[2]) is RestrictedTransaction and out[2].routes == frozenset({"all"})
    rules = OriginRules(NONE_POLICY, {"local": None, "all": None})
    out = OriginFilterActor(rules=rules, inbox=None, out=None).filter([txn(2, "node_b", 300)])
    assert out == [FilteredTransaction(300, 350, 360, "node_b")]


async def _pipeline(rules: OriginRules, events: list[list], meta=None) -> list:
    ev_tx, ev_rx = trio.open_memory_channel(4)
    of_tx, of_rx = trio.open_memory_channel(4)
    out_tx, out_rx = trio.open_memory_channel(100)

    def router_for(names=None):
        return ChangeRouter([s for s in SPECS if names is None or s.name in names], db="db")

    router_actor = RouterActor(router=router_for(), inbox=of_rx, out=out_tx, router_for=router_for,
                         meta=meta)
    filt = OriginFilterActor(rules=rules, inbox=ev_rx, out=of_tx)
    got = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(router_actor.run)
            await nursery.start(filt.run)
            async with ev_tx:
                for batch in events:
                    await ev_tx.send(batch)
            async with out_rx:
                async for group in out_rx:  # the fanout sends lists of items
                    got.extend(group)
    return got


async def test_pipeline_confirms_dropped_transactions_in_order():
    rules = OriginRules(NONE_POLICY, {"local": None, "all": None})
    got = await _pipeline(rules, [[txn(2, None, 100), txn(3, "node_b", 200)],
                                  [Keepalive(400), txn(1, "node_c", 500)]])
    chunks = [g for g in got if type(g) is RoutedChunk]
    assert [(c.end_lsn, len(c.records), c.last) for c in chunks] == [
        (160, 4, True), (260, 0, True), (560, 0, True)]
    assert got[2] == Keepalive(400)  # order kept


async def test_pipeline_routes_restricted_transactions_by_their_routes_only():
    rules = OriginRules(ANY_POLICY, {"local": NONE_POLICY, "all": None})
    meta = TransactionMeta("tx", db="db")
    got = await _pipeline(rules, [[txn(2, "node_b", 100), txn(1, None, 200)]], meta=meta)
    by_end = {}
    for c in got:
        by_end.setdefault(c.end_lsn, []).extend(c.records)
    replicated = [r[0] for r in by_end[160]]
    assert replicated == ["tx", "all.public.t", "all.public.t", "tx"]
    end = json.loads(by_end[160][-1][2])
    assert end["data_collections"] == [{"data_collection": "all.public.t", "event_count": 2}]
    local = sorted(r[0] for r in by_end[260])
    assert local == ["all.public.t", "local.public.t", "tx", "tx"]
    origins = {json.loads(r[2])["source"]["origin"] for r in by_end[160]}
    assert origins == {"node_b"}


async def test_lists_policy_with_patterns():
    rules = OriginRules(OriginPolicy("lists", allow=("node_a*",)), {"local": None, "all": None})
    got = await _pipeline(rules, [[txn(1, "node_a1", 100), txn(1, "node_b", 200),
                                   txn(1, None, 300)]])
    assert [len(c.records) for c in got] == [2, 0, 2]
