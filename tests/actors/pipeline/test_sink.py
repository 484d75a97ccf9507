"""The sink's delivery contract, driven with an in-memory client whose acknowledgements the
test releases by hand: accepted is not durable."""

from __future__ import annotations

import pytest
import trio

from actors.pipeline.mailbox import Registered, Acked, Keepalive
from actors.pipeline.confirmer import Stats
from actors.pipeline.sink import SinkActor
from router.routing.topics import TopicSpec
from router.delivery.tally import Tally
from router.errors import RecordTooLarge, SinkError
from router.routing.change_router import RoutedChunk


class HeldClient:
    """Keeps every record's delivery callback until the test acknowledges it; per-record
    callbacks reach the sink through ``router.delivery.tally.Tally``, as with the real clients."""

    def __init__(self):
        self.pending = []  # (tally, record)
        self.topics = []
        self.schemas = []
        self.closed = False

    def produce(self, records, ticket, on_done):
        tally = Tally(len(records), on_done, ticket)
        self.pending.extend((tally, r) for r in records)

    def produce_sync(self, topic, key, value, timeout=60.0):
        self.schemas.append((topic, key))

    def ensure_topics(self, specs):
        self.topics.extend(s.name for s in specs)

    def flush(self, timeout=None):
        pass

    def close(self, timeout=10.0):
        self.closed = True

    @staticmethod
    def map_error(exc):
        return exc if isinstance(exc, SinkError) else SinkError(str(exc))

    def ack(self, n=None, error=None):
        take = self.pending[:n] if n is not None else list(self.pending)
        del self.pending[:len(take)]
        for tally, _ in take:
            if error is not None:
                tally.fail(error)
            else:
                tally.ack("metadata")


def chunk(end_lsn, n, *, last=True, topics=()):
    records = [("t", b"k", b"v%d" % i, []) for i in range(n)]
    return RoutedChunk(1, end_lsn, end_lsn, records, [], last, list(topics))


async def start(client, nursery, stats=None):
    chunks_tx, chunks_rx = trio.open_memory_channel(8)
    prog_tx, prog_rx = trio.open_memory_channel(64)
    sink = SinkActor(client=client, inbox=chunks_rx, tickets=prog_tx, schema_topic="schemas",
                     topic_specs={"r": TopicSpec("r", 3)}, stats=stats)
    await nursery.start(sink.run)
    return chunks_tx, prog_rx


async def expect(rx, n):
    """The next ``n`` progress events, then nothing more for a while (the sink works in
    worker threads, so "nothing more" is checked after letting them run)."""
    out: list = []
    with trio.fail_after(5):
        while len(out) < n:
            out.extend(await rx.receive())  # the sink sends lists of events
    await trio.sleep(0.1)
    with pytest.raises(trio.WouldBlock):
        rx.receive_nowait()
    return out


async def test_done_only_after_every_record_is_acknowledged():
    client = HeldClient()
    async with trio.open_nursery() as nursery:
        chunks, progress = await start(client, nursery)
        await chunks.send([chunk(100, 3, last=False, topics=[("t", "r")])])
        await chunks.send([chunk(100, 2, last=True)])
        assert await expect(progress, 1) == [Registered(0, 100)], "sent is not done"
        assert client.topics == ["t"]
        client.ack(4)
        assert await expect(progress, 0) == []
        client.ack()
        assert await expect(progress, 1) == [Acked(0, 5)]
        await chunks.aclose()


async def test_acknowledged_records_are_counted_while_the_transaction_is_open():
    """Progress lines read ``stats.acked_records``: it grows with every acknowledged batch
    of records, not only when a whole transaction is done (a huge transaction would show
    records_acked=0 for minutes)."""
    client = HeldClient()
    stats = Stats()
    async with trio.open_nursery() as nursery:
        chunks, progress = await start(client, nursery, stats)
        await chunks.send([chunk(100, 3, last=False)])
        await chunks.send([chunk(100, 4, last=False)])
        assert await expect(progress, 1) == [Registered(0, 100)]
        client.ack(3)  # the first batch: acknowledged, the transaction still open
        with trio.fail_after(5):
            while stats.acked_records < 3:
                await trio.sleep(0.01)
        assert stats.acked_records == 3
        client.ack()
        await chunks.send([chunk(100, 0, last=True)])
        assert await expect(progress, 1) == [Acked(0, 7)]
        assert stats.acked_records == 7, "each record counted once"
        await chunks.aclose()


async def test_whole_transactions_share_a_hand_over_and_big_ones_do_not():
    """Consecutive one-chunk transactions under one ticket reach the client in one produce
    call; the chunks of a larger transaction each in their own (their acknowledgements are
    counted as they come)."""
    client = HeldClient()
    async with trio.open_nursery() as nursery:
        chunks, progress = await start(client, nursery)
        await chunks.send([chunk(100 + i, 1) for i in range(50)])
        assert await expect(progress, 1) == [Registered(0, 149)]
        assert len({id(tally) for tally, _ in client.pending}) == 1
        assert [r[2] for _, r in client.pending] == [b"v0"] * 50
        client.ack()
        assert await expect(progress, 1) == [Acked(0, 50)]
        await chunks.send([chunk(300, 2, last=False), chunk(300, 3, last=False),
                           chunk(300, 1)])
        assert await expect(progress, 1) == [Registered(1, 300)]
        per_call = {}
        for tally, _ in client.pending:
            per_call[id(tally)] = per_call.get(id(tally), 0) + 1
        assert list(per_call.values()) == [2, 3, 1]
        client.ack()
        assert await expect(progress, 1) == [Acked(1, 6)]
        await chunks.aclose()


async def test_keepalive_and_registration_keep_commit_order():
    client = HeldClient()
    async with trio.open_nursery() as nursery:
        chunks, progress = await start(client, nursery)
        await chunks.send([chunk(100, 1)])
        await chunks.send([Keepalive(150)])
        await chunks.send([chunk(200, 0)])  # everything filtered out: done at once
        got = await expect(progress, 4)
        assert got == [Registered(0, 100), Keepalive(150), Registered(1, 200), Acked(1, 0)]
        client.ack()
        assert await expect(progress, 1) == [Acked(0, 1)]
        await chunks.aclose()


async def test_failed_delivery_fails_the_sink_and_reports_nothing_done():
    client = HeldClient()
    seen = []
    with pytest.raises(BaseExceptionGroup) as info:
        async with trio.open_nursery() as nursery:
            chunks, progress = await start(client, nursery)
            await chunks.send([chunk(100, 2)])
            seen += await expect(progress, 1)
            client.ack(1)
            client.ack(1, error=RecordTooLarge("too big"))
            with trio.fail_after(5):
                await trio.sleep_forever()
    assert info.group_contains(RecordTooLarge)
    assert seen == [Registered(0, 100)], "nothing may be reported done"


class RefusingClient(HeldClient):
    """Refuses every record as too large when it is handed over."""

    def produce(self, records, ticket, on_done):
        raise RecordTooLarge("record too large for Kafka: topic t")


async def test_a_sink_failure_is_what_the_pipeline_reports_not_its_peers_echo():
    """The sink fails while an upstream actor keeps sending: the upstream send breaks at once
    and the pipeline is cancelled, but the sink's own failure must leave its task (closing
    its channels with a checkpoint let ``Cancelled`` replace it, and only the peer's
    ``BrokenResourceError`` was reported)."""
    from actors.services.retry import primary

    async def upstream(tx):
        with tx:
            for i in range(1000):
                await tx.send([chunk(i + 1, 1)])

    prog_tx, prog_rx = trio.open_memory_channel(64)
    for _ in range(20):  # the race either way round
        chunks_tx, chunks_rx = trio.open_memory_channel(0)
        sink = SinkActor(client=RefusingClient(), inbox=chunks_rx, tickets=prog_tx.clone(),
                         schema_topic="schemas", topic_specs={}, stats=None)
        with pytest.raises(BaseExceptionGroup) as info:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(upstream, chunks_tx)
                nursery.start_soon(sink.run)
                nursery.start_soon(_drain, prog_rx.clone())
        assert isinstance(primary(info.value), RecordTooLarge), info.value


async def _drain(rx):
    async for _ in rx:
        pass


class SplittingFormat:
    """A format that registers schemas (as Avro does): a record whose value starts with
    ``b"kc"`` becomes two (a key change), and records of topic ``"new"`` need a schema until
    ``register`` is called."""

    name = "splitting"
    registers = True
    packs = False

    def __init__(self):
        self.registered: list = []
        self.threads: set = set()

    def learn(self, chunk):
        pass

    def convert(self, records):
        import threading

        from router.formats.avro import SchemasNeeded, Subject

        self.threads.add(threading.current_thread().name)
        if any(r[0] == "new" for r in records) and not self.registered:
            raise SchemasNeeded([Subject("new-value", "{}", "new")])
        out = []
        for r in records:
            out.extend([r, r] if r[2].startswith(b"kc") else [r])
        return out

    def register(self, subjects):
        self.registered.extend(s.subject for s in subjects)

    def __call__(self, chunk):
        return self.convert(chunk.records)


async def test_converted_in_the_producing_thread_and_done_only_with_the_extra_records():
    """With a format that registers schemas, records are converted where they are produced
    (not on the trio thread); a record the conversion makes two of counts twice before it
    is produced, so its transaction is done only when both are acknowledged; a schema
    without an id is registered and the batch goes on from the records that need it."""
    client = HeldClient()
    fmt = SplittingFormat()
    chunks_tx, chunks_rx = trio.open_memory_channel(8)
    prog_tx, progress = trio.open_memory_channel(64)
    sink = SinkActor(client=client, inbox=chunks_rx, tickets=prog_tx, schema_topic="schemas",
                     topic_specs={"r": TopicSpec("r", 3)}, fmt=fmt)
    async with trio.open_nursery() as nursery:
        await nursery.start(sink.run)
        kc = RoutedChunk(1, 100, 100, [("t", b"k", b"v0", []), ("t", b"k", b"kc1", [])], [],
                         True, [])
        await chunks_tx.send([kc])
        assert await expect(progress, 1) == [Registered(0, 100)]
        assert [r[2] for _, r in client.pending] == [b"v0", b"kc1", b"kc1"]
        client.ack(2)
        assert await expect(progress, 0) == [], "done before the key change's second record"
        client.ack()
        assert await expect(progress, 1) == [Acked(0, 3)]
        late = RoutedChunk(1, 200, 200, [("new", b"k", b"v1", [])], [], True, [])
        await chunks_tx.send([late])
        assert await expect(progress, 1) == [Registered(1, 200)]
        assert fmt.registered == ["new-value"]
        assert [r[2] for _, r in client.pending] == [b"v1"]
        client.ack()
        assert await expect(progress, 1) == [Acked(1, 1)]
        assert fmt.threads and "MainThread" not in fmt.threads  # the producing thread's
        await chunks_tx.aclose()
