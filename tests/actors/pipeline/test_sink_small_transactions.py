"""Consecutive small transactions taken together by the sink share one registration: the
flush LSN may move past them only once every record of every one of them (and of every
earlier transaction) is acknowledged."""

from __future__ import annotations

import trio

from actors.pipeline.mailbox import Registered, Acked, Keepalive
from actors.pipeline.sink import SinkActor
from router.routing.topics import TopicSpec
from router.delivery.confirmation import ConfirmationTracker
from router.routing.change_router import RoutedChunk

from test_sink import HeldClient, expect


def txn(end_lsn, n, *, last=True, xid=1):
    records = [("t", b"k%d" % end_lsn, b"v%d" % i, []) for i in range(n)]
    return RoutedChunk(xid, end_lsn, end_lsn, records, [], last, [])


async def start(client, nursery):
    chunks_tx, chunks_rx = trio.open_memory_channel(8)
    prog_tx, prog_rx = trio.open_memory_channel(64)
    sink = SinkActor(client=client, inbox=chunks_rx, tickets=prog_tx, schema_topic="schemas",
                     topic_specs={"r": TopicSpec("r", 1)})
    await nursery.start(sink.run)
    return chunks_tx, prog_rx


def apply(tracker: ConfirmationTracker, events) -> None:
    for ev in events:
        if type(ev) is Registered:
            tracker.begin(ev.ticket, ev.end_lsn)
        elif type(ev) is Acked:
            tracker.done(ev.ticket)
        elif type(ev) is Keepalive:
            tracker.keepalive(ev.lsn)


async def drain(rx, tracker):
    await trio.sleep(0.1)  # the sink's worker threads and callbacks
    while True:
        try:
            apply(tracker, rx.receive_nowait())
        except trio.WouldBlock:
            return


async def test_a_group_is_confirmed_only_when_every_record_of_it_is_acknowledged():
    """Twenty one-row transactions (and one of three rows) in one group: acknowledging
    records one at a time, the confirmed LSN never reaches the end of a transaction
    that still has a record waiting, and reaches the last end once all are acknowledged."""
    client = HeldClient()
    tracker = ConfirmationTracker(0)
    group = [txn(100 * (i + 1), 3 if i == 7 else 1) for i in range(20)]
    record_end = [c.end_lsn for c in group for _ in c.records]  # commit order
    async with trio.open_nursery() as nursery:
        chunks, progress = await start(client, nursery)
        await chunks.send(group)
        await drain(progress, tracker)
        assert tracker.confirmed == 0, "nothing is acknowledged yet"
        for acked in range(1, len(record_end) + 1):
            client.ack(1)
            await drain(progress, tracker)
            first_waiting = record_end[acked] if acked < len(record_end) else None
            if first_waiting is not None:
                assert tracker.confirmed < first_waiting, (acked, tracker.confirmed)
        assert tracker.confirmed == 2000
        assert tracker.in_flight == 0
        await chunks.aclose()


async def test_a_group_starting_with_an_empty_transaction_waits_for_the_rest():
    """The first transaction of the group has no records (all filtered out): it is done at
    once, but the registration it shares must still wait for the others' records."""
    client = HeldClient()
    tracker = ConfirmationTracker(0)
    async with trio.open_nursery() as nursery:
        chunks, progress = await start(client, nursery)
        await chunks.send([txn(100, 0), txn(200, 1), txn(300, 0), txn(400, 1)])
        await drain(progress, tracker)
        assert tracker.confirmed < 200, "200 and 400 wait for their records"
        client.ack(1)
        await drain(progress, tracker)
        assert tracker.confirmed < 400, "400 waits for its record"
        client.ack(1)
        await drain(progress, tracker)
        assert tracker.confirmed == 400
        await chunks.aclose()


async def test_one_registration_per_group_of_whole_transactions():
    client = HeldClient()
    async with trio.open_nursery() as nursery:
        chunks, progress = await start(client, nursery)
        await chunks.send([txn(100, 1), txn(200, 1), txn(300, 0), txn(400, 2)])
        assert await expect(progress, 1) == [Registered(0, 400)]
        client.ack()
        assert await expect(progress, 1) == [Acked(0, 4)]
        await chunks.aclose()


async def test_a_keepalive_between_transactions_keeps_its_place():
    """A keepalive ends the shared registration: the transactions before it are registered
    before it, those after it after it, each set done when its own records are."""
    client = HeldClient()
    tracker = ConfirmationTracker(0)
    async with trio.open_nursery() as nursery:
        chunks, progress = await start(client, nursery)
        await chunks.send([txn(100, 1), txn(200, 1), Keepalive(250), txn(300, 1)])
        events = await expect(progress, 3)
        assert events == [Registered(0, 200), Keepalive(250), Registered(1, 300)]
        apply(tracker, events)
        client.ack(1)
        await drain(progress, tracker)
        assert tracker.confirmed == 0, "the second transaction's record is not acknowledged"
        client.ack(1)
        await drain(progress, tracker)
        assert tracker.confirmed == 250
        client.ack(1)
        await drain(progress, tracker)
        assert tracker.confirmed == 300
        await chunks.aclose()


async def test_a_transaction_spanning_groups_then_small_ones():
    """A transaction whose first chunk was registered alone, finished in the next group
    together with small ones: none is confirmed before all its records are acknowledged."""
    client = HeldClient()
    tracker = ConfirmationTracker(0)
    async with trio.open_nursery() as nursery:
        chunks, progress = await start(client, nursery)
        await chunks.send([txn(100, 2, last=False)])
        apply(tracker, await expect(progress, 1))
        await chunks.send([txn(100, 1), txn(200, 1), txn(300, 1)])
        await drain(progress, tracker)
        client.ack(3)  # the big transaction's records
        await drain(progress, tracker)
        assert tracker.confirmed == 100
        client.ack(1)
        await drain(progress, tracker)
        assert tracker.confirmed == 100, "300 still waits for its record"
        client.ack()
        await drain(progress, tracker)
        assert tracker.confirmed == 300
        await chunks.aclose()
