"""After an initial snapshot the stream's backfill actor starts from the progress records the
snapshot read and wrote (``StateStore.adopt``, handed over by ``actors.runner.coordinator``)
instead of reading the whole progress topic a second time; a start without a snapshot
still reads it."""

from __future__ import annotations

from types import SimpleNamespace

import trio
import trio.testing

from actors.runner import coordinator
from actors.snapshot.initial import SnapshotResult
from actors.snapshot.store import StateStore
from router.snapshot.core import SnapshotState, encode_state

CFG = SimpleNamespace(snapshot=SimpleNamespace(state_topic="pgrouter.snapshots"))


class Actor:
    def __init__(self, inbox=None):
        self.inbox = inbox

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if self.inbox is None:
            await trio.sleep_forever()
        async for _ in self.inbox:
            pass


class Slot(Actor):
    def stop_reading(self) -> None:
        pass


class Backfill(Actor):
    """Sees its store as its start would (``BackfillActor._start``)."""

    def __init__(self):
        super().__init__()
        self.store = StateStore(CFG, client=None, slot="s")
        self.seen = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.seen = (self.store.loaded, dict(self.store.records))
        await super().run(task_status=task_status)


class Pipeline:
    def __init__(self):
        self.inbox, rx = trio.open_memory_channel(10)
        self.tickets = None
        self.sink = Actor(rx)
        # the confirm actor (named ``progress`` before)
        self.confirm = self.progress = Actor()
        self.backfill = Backfill()
        self.origin_filter = None
        self.slot = Slot()
        self.monitor, self.watch = Actor(), Actor()
        self.done = trio.Event()


class Snapshot:
    def __init__(self, store: StateStore):
        self.store = store

    async def run(self, out, acks, stop) -> SnapshotResult:
        with out:
            self.store.records[b"k"] = SnapshotState("initial", "s", "done")
        return SnapshotResult(consistent_point=42, done=("public.t",))


async def _started_backfill(snapshot) -> Backfill:
    p = Pipeline()
    drain = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(coordinator.run, p, snapshot, drain, lambda: None)
            await trio.testing.wait_all_tasks_blocked()
            drain.set()
            await trio.testing.wait_all_tasks_blocked()
            p.inbox.close()
            nursery.cancel_scope.cancel()
    return p.backfill


def test_the_backfill_actor_starts_from_the_snapshots_progress_records():
    store = StateStore(CFG, client=None, slot="s")
    key, _ = encode_state(SnapshotState("backfill", "s", "done", route="r", table="public.t",
                                        request="initial"))
    store.records, store.loaded = {key: SnapshotState("backfill", "s", "done")}, True
    backfill = trio.run(_started_backfill, Snapshot(store))
    loaded, records = backfill.seen
    assert loaded  # its start does not read the topic again
    assert set(records) == {key, b"k"}  # what the snapshot read, and what it wrote


def test_without_a_snapshot_the_backfill_actor_reads_the_topic():
    backfill = trio.run(_started_backfill, None)
    assert backfill.seen == (False, {})
