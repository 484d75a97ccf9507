"""A transaction produced in parts while it arrives (``router.stream.transactions``): its
chunks come with end LSN 0 until the last; the sink registers it before its end is known,
registers it again with its end before it can be done, and a ticket whose transaction the
input never finished is never done (the slot is not confirmed past it)."""

from __future__ import annotations

import trio

from actors.pipeline.mailbox import Acked, Registered
from router.delivery.confirmation import ConfirmationTracker
from router.routing.change_router import RoutedChunk
from tests.actors.pipeline.test_sink import HeldClient, chunk, expect, start


def part(n: int) -> RoutedChunk:
    records = [("t", b"k", b"p%d" % i, []) for i in range(n)]
    return RoutedChunk(1, 500, 0, records, [], False, [])


async def test_a_transaction_in_parts_is_registered_again_with_its_end():
    client = HeldClient()
    async with trio.open_nursery() as nursery:
        chunks, progress = await start(client, nursery)
        await chunks.send([part(3)])
        assert await expect(progress, 1) == [Registered(0, 0)]
        await chunks.send([part(2)])
        client.ack()  # every record so far durable: still not done, its end is not known
        assert await expect(progress, 0) == []
        await chunks.send([chunk(508, 1, last=True)])
        assert await expect(progress, 1) == [Registered(0, 508)]
        client.ack()
        assert await expect(progress, 1) == [Acked(0, 6)]
        await chunks.aclose()


async def test_a_part_joining_an_unsent_registration_carries_the_end_in_it():
    client = HeldClient()
    async with trio.open_nursery() as nursery:
        chunks, progress = await start(client, nursery)
        # one group: a whole transaction, then all of one in parts (one shared ticket)
        await chunks.send([chunk(100, 1), part(2), chunk(508, 1, last=True)])
        assert await expect(progress, 1) == [Registered(0, 508)]
        client.ack()
        assert await expect(progress, 1) == [Acked(0, 4)]
        await chunks.aclose()


async def test_input_ending_inside_a_transaction_leaves_it_undone():
    client = HeldClient()
    async with trio.open_nursery() as nursery:
        chunks, progress = await start(client, nursery)
        await chunks.send([chunk(100, 1)])
        assert await expect(progress, 1) == [Registered(0, 100)]
        client.ack()
        assert await expect(progress, 1) == [Acked(0, 1)]
        await chunks.send([part(2)])
        assert await expect(progress, 1) == [Registered(1, 0)]
        await chunks.aclose()  # a drain in the middle of it: the sink ends, no Acked
        with trio.fail_after(5):
            rest = [ev async for events in progress for ev in events]
        client.ack()  # its records acknowledged late change nothing
        assert rest == []


def test_the_tracker_confirms_a_transaction_in_parts_at_its_end_only():
    t = ConfirmationTracker(50)
    t.begin("a", 0)
    t.begin("a", 508)  # the end, once known
    t.keepalive(600)
    assert t.confirmed == 50
    t.done("a")
    assert t.confirmed == 600 and t.in_flight == 0
