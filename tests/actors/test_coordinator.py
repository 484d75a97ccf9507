"""``actors.runner.coordinator``: the sink first, then the initial snapshot, then the stream;
a snapshot stopped by a drain never starts the stream."""

from __future__ import annotations

import trio
import trio.testing

from actors.runner import coordinator
from actors.snapshot.initial import SnapshotResult


class Actor:
    """Records when it started; runs until cancelled, or until its inbox closes (the sink)."""

    def __init__(self, name: str, log: list, inbox=None):
        self.name, self.log, self.inbox = name, log, inbox

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.log.append(self.name)
        task_status.started()
        if self.inbox is None:
            await trio.sleep_forever()
        async for _ in self.inbox:
            pass
        self.log.append(f"{self.name} drained")


class Slot(Actor):
    def stop_reading(self) -> None:
        self.log.append("stop reading")


class Pipeline:
    def __init__(self, log: list):
        self.inbox, rx = trio.open_memory_channel(10)
        self.tickets = None
        self.sink = Actor("sink", log, rx)
        self.confirm, self.backfill = Actor("confirm", log), None
        self.origin_filter = None
        self.slot = Slot("slot", log)
        self.monitor, self.watch = Actor("monitor", log), Actor("watch", log)
        self.done = trio.Event()


class Snapshot:
    def __init__(self, log: list, result: SnapshotResult):
        self.log, self.result = log, result

    async def run(self, out, acks, stop) -> SnapshotResult:
        with out:
            self.log.append("snapshot")
        return self.result


async def _run(result: SnapshotResult | None, drain_after: bool) -> tuple[list, object]:
    log: list = []
    p = Pipeline(log)
    drain = trio.Event()
    snapshot = Snapshot(log, result) if result is not None else None
    box: list = [None]
    with trio.fail_after(30):  # a coordinator that never returns fails instead of hanging
        await _drive(p, snapshot, drain, drain_after, log, box)
    return log, box[0]


async def _drive(p, snapshot, drain, drain_after, log, box) -> None:
    async with trio.open_nursery() as nursery:
        async def go():
            box[0] = await coordinator.run(p, snapshot, drain,
                                           streaming=lambda: log.append("streaming"))
        nursery.start_soon(go)
        await trio.testing.wait_all_tasks_blocked()
        if drain_after:
            drain.set()  # the slot reader stops reading; the test's actors end with the scope
            await trio.testing.wait_all_tasks_blocked()
            p.inbox.close()
            nursery.cancel_scope.cancel()


def test_a_snapshot_runs_after_the_sink_and_before_the_stream():
    done = SnapshotResult(consistent_point=42, done=("public.t",))
    log, _ = trio.run(_run, done, True)
    order = [e for e in log if e not in ("monitor", "watch")]
    assert order[:5] == ["sink", "snapshot", "confirm", "slot", "streaming"]
    assert "stop reading" in order


def test_a_snapshot_stopped_by_a_drain_closes_the_sink_and_never_streams():
    stopped = SnapshotResult(consistent_point=42, done=(), stopped=True)
    log, got = trio.run(_run, stopped, False)
    order = [e for e in log if e not in ("monitor", "watch")]
    assert order == ["sink", "snapshot", "sink drained"]
    assert got == stopped


def test_without_a_snapshot_the_stream_starts_after_the_sink():
    log, _ = trio.run(_run, None, True)
    order = [e for e in log if e not in ("monitor", "watch")]
    assert order[:4] == ["sink", "confirm", "slot", "streaming"]
