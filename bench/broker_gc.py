"""The Kafka broker's garbage-collection pauses while a bench runs (``bench/latency.py``).

``jstat -gc PID 200`` (the JDK's reader of a JVM's performance counters: it attaches to
nothing and changes nothing in the broker) is read line by line; whenever the broker's total
stop-the-world GC time (the GCT column: young, full and the concurrent cycle's pauses) has
grown since the sample before, a pause of that length ended within those 200 ms. A record
that waited in the broker while it stood still shows next to it: the machine's own path
stalled, not the router. The broker's pid is the dev stack's (``.devstack/kafka/kafka.pid``)
unless given; with no jstat or no broker on this machine nothing is watched.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: sampling period of jstat, milliseconds: how precisely a pause is placed in time (jstat is
#: a JVM of its own: about 1.5% of a core at 200 ms)
PERIOD_MS = 200


def broker_pid(given: int | None = None) -> int | None:
    """The broker's pid: ``given``, else the dev stack's, if that process is alive."""
    if given is None:
        try:
            given = int((ROOT / ".devstack" / "kafka" / "kafka.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
    return given if pathlib.Path(f"/proc/{given}").exists() else None


class BrokerGC(threading.Thread):
    """``pauses``: (wall-clock time the sample saw it, seconds) for every GC pause of the
    broker while it runs; ``stop()`` ends it."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pauses: list[tuple[float, float]] = []
        self.proc = subprocess.Popen([shutil.which("jstat") or "jstat", "-gc", str(pid),
                                      str(PERIOD_MS)],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    @classmethod
    def start_for(cls, pid: int | None) -> BrokerGC | None:
        if pid is None or shutil.which("jstat") is None:
            return None
        watcher = cls(pid)
        watcher.start()
        return watcher

    def run(self) -> None:
        column, last = None, None
        for raw in self.proc.stdout:
            now = time.time()
            fields = raw.decode().split()
            if "GCT" in fields:  # the header (jstat repeats none with these arguments)
                column = fields.index("GCT")
                continue
            if column is None or len(fields) <= column:
                continue
            try:
                total = float(fields[column])
            except ValueError:
                continue
            if last is not None and total > last:
                self.pauses.append((now, total - last))
            last = total

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.join(5)

    def within(self, start: float, end: float) -> list[tuple[float, float]]:
        """The pauses seen from ``start`` to ``end`` (wall clock)."""
        return [(t, s) for t, s in self.pauses if start <= t <= end + PERIOD_MS / 1000]

    def summary(self, start: float, end: float) -> str:
        got = self.within(start, end)
        if not got:
            return "broker GC: no pause"
        return (f"broker GC: {len(got)} pauses, longest {max(s for _, s in got) * 1000:.0f} ms, "
                f"{sum(s for _, s in got) * 1000:.0f} ms in all")


def said(gc: BrokerGC | None, began: float | None) -> None:
    """Prints the pauses since ``began`` (a path's start), or, with None, stops watching."""
    if gc is None:
        return
    if began is None:
        gc.stop()
    else:
        print(f"  {gc.summary(began, time.time())}")
