"""The router actor sends what a large batch produced in parts while it routes the rest: the
first transactions of a backlog (a batch of up to 2,000 walsender messages after a pause)
reach the sink without waiting for the whole batch to be routed (issue 55: the latency
tail). A batch routed within ``CUT_SECONDS`` still goes on as one list."""

from __future__ import annotations

import trio

from actors.pipeline import router_actor
from actors.pipeline.router_actor import RouterActor
from router.pgoutput import Begin, Commit, Insert, Relation, RelationColumn
from router.stream.relations import RelationCache
from router.routing.change_router import ChangeRouter, RouteSpec
from router.stream.transactions import TransactionAssembler

REL = Relation(100, "public", "t", "d",
               (RelationColumn(1, "id", 23, -1), RelationColumn(0, "v", 25, -1)))


def one_row_transactions(count: int) -> list:
    a = TransactionAssembler(RelationCache())
    a.feed(1, REL)
    out = []
    for n in range(count):
        lsn = 1000 + 100 * n
        a.feed(lsn, Begin(lsn + 50, 7, n))
        a.feed(lsn + 1, Insert(100, (str(n), "x")))
        out.extend(a.feed(lsn + 40, Commit(0, lsn + 50, lsn + 60, 7)))
    return out


def actor(out) -> RouterActor:
    router = ChangeRouter([RouteSpec("r", tables=frozenset({("public", "t")}))], db="db")
    return RouterActor(router=router, inbox=None, out=out)


async def test_a_batch_that_takes_long_to_route_goes_on_in_parts_as_it_is_routed(monkeypatch):
    monkeypatch.setattr(router_actor, "CUT_SECONDS", -1.0)  # every routed part is late
    tx, rx = trio.open_memory_channel(0)  # the sink takes a part only when it receives it
    handled = trio.Event()

    async def handle():
        await actor(tx).handle(one_row_transactions(3))
        handled.set()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(handle)
            first = await rx.receive()
            assert not handled.is_set()  # the rest is still being routed
            got = [first, await rx.receive(), await rx.receive()]
    assert [len(group) for group in got] == [1, 1, 1]
    assert [chunk.xid for group in got for chunk in group] == [0, 1, 2]


async def test_a_batch_routed_in_time_goes_on_as_one_list(monkeypatch):
    monkeypatch.setattr(router_actor, "CUT_SECONDS", 60.0)
    tx, rx = trio.open_memory_channel(10)
    await actor(tx).handle(one_row_transactions(3))
    (group,) = [rx.receive_nowait()]
    assert [chunk.xid for chunk in group] == [0, 1, 2]
    assert rx.statistics().current_buffer_used == 0
