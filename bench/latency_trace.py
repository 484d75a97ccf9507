"""``pgrouter run`` with a record of where its trio thread stops (``bench/latency.py --trace``).

    python bench/latency_trace.py run -c router.toml      # TRACE_LOG=FILE, TRACE_MS=10

Runs the ``pgrouter`` command with, added to ``trio.run``, an instrument that writes one line
for every task step longer than ``TRACE_MS`` milliseconds (the task's name and the thread's CPU
time in it: a synchronous call on the event loop shows here, with little CPU when it waited),
one for every wait for I/O that returned more than ``TRACE_MS`` late (the process was not
scheduled), one for every garbage collection longer than 2 ms or of the oldest generation
(``gc.callbacks``), and one for every batch from the walsender whose first commit was older
than ``TRACE_MS`` when it arrived (the wait was before the router). Each line
starts with the wall-clock time, so ``bench/latency.py`` lays them next to its slowest records.
A diagnosis tool: nothing in pgrouter reads it.
"""

from __future__ import annotations

import gc
import os
import sys
import time

import trio

sys.path.insert(0, os.getcwd())  # the checkout measured (bench/latency.py: --router-root)

LOG = open(os.environ.get("TRACE_LOG", "latency-trace.log"), "a", buffering=1)
LIMIT = float(os.environ.get("TRACE_MS", "10")) / 1000


class LongSteps(trio.abc.Instrument):
    def __init__(self):
        self.step = self.cpu = 0.0
        self.wait = (0.0, 0.0)

    def before_task_step(self, task) -> None:
        self.step = time.perf_counter()
        self.cpu = time.thread_time()

    def after_task_step(self, task) -> None:
        took = time.perf_counter() - self.step
        if took > LIMIT:  # CPU: the thread's own; the rest it waited (GIL, scheduler, I/O)
            LOG.write(f"{time.time():.3f} step {took * 1000:.1f} ms (CPU "
                      f"{(time.thread_time() - self.cpu) * 1000:.1f} ms) {task.name}\n")

    def before_io_wait(self, timeout: float) -> None:
        self.wait = (time.perf_counter(), timeout)

    def after_io_wait(self, timeout: float) -> None:
        began, asked = self.wait
        late = time.perf_counter() - began - asked
        if asked > 0 and late > LIMIT:
            LOG.write(f"{time.time():.3f} io-wait {late * 1000:.1f} ms late (asked "
                      f"{asked * 1000:.1f} ms)\n")


_gc_start = [0.0]


def _gc(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_start[0] = time.perf_counter()
        return
    took = time.perf_counter() - _gc_start[0]
    if took > 0.002 or info["generation"] == 2:
        LOG.write(f"{time.time():.3f} gc gen{info['generation']} {took * 1000:.1f} ms "
                  f"collected {info['collected']} tracked {len(gc.get_objects())}\n"
                  if info["generation"] == 2 else
                  f"{time.time():.3f} gc gen{info['generation']} {took * 1000:.1f} ms\n")


#: PostgreSQL's epoch (2000-01-01 UTC) in Unix seconds: pgoutput's commit timestamps count from it
PG_EPOCH = 946_684_800


def _watch_receive() -> None:
    """The slot reader's batches: a line when a batch holds a commit older than ``TRACE_MS``
    at its arrival (pgoutput's Commit message: its timestamp, in microseconds since 2000),
    so a wait before the router (the server, the walsender) is told from one inside it."""
    from actors.pipeline import slot_reader

    drain = slot_reader.drain

    def traced(read_message, max_messages, max_bytes):
        batch, exhausted = drain(read_message, max_messages, max_bytes)
        if batch:
            now = time.time()
            oldest = None
            for _, payload in batch:
                if payload[:1] == b"C" and len(payload) >= 26:
                    oldest = int.from_bytes(payload[18:26], "big", signed=True)
                    break
            if oldest is not None:
                age = now - (oldest / 1e6 + PG_EPOCH)
                if age > LIMIT:
                    LOG.write(f"{now:.3f} received a commit {age * 1000:.1f} ms old "
                              f"({len(batch)} messages in the batch)\n")
        return batch, exhausted

    slot_reader.drain = traced


def main() -> int:
    gc.callbacks.append(_gc)
    _watch_receive()
    plain_run = trio.run

    def run(*args, **kwargs):
        kwargs.setdefault("instruments", []).append(LongSteps())
        return plain_run(*args, **kwargs)

    trio.run = run
    from actors.cli import main as pgrouter

    sys.argv = ["pgrouter"] + sys.argv[1:]
    return pgrouter()


if __name__ == "__main__":
    sys.exit(main())
