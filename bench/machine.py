"""CPU seconds on this machine, for the benches: of one process, of the Kafka broker, of a
local PostgreSQL cluster (its postmaster and every backend, the ended ones included), and of
the machine as a whole (busy and idle) — so a bench can show where a run's CPU went and
whether the cores were saturated, in the same run as its figures.

    meter = Meter(dsn)          # finds the broker and the cluster once
    before = meter.read()
    ...                         # the run
    used = meter.read() - before  # Usage: .broker, .postgres, .busy, .idle (CPU seconds)

A part not found (a remote PostgreSQL, a broker in another machine) reads as None.
"""

from __future__ import annotations

import os
import pathlib
import statistics
from dataclasses import dataclass

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_of(pid: int, *, children: bool = False) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads); with ``children``,
    plus those of its children it has waited for (a postmaster's ended backends). 0 when
    the process is gone."""
    f = _stat(pid)
    if f is None:
        return 0.0
    ticks = int(f[11]) + int(f[12]) + ((int(f[13]) + int(f[14])) if children else 0)
    return ticks / TICK


def threads_of(pid: int) -> dict[int, tuple[str, float, int]]:
    """Each thread of process ``pid``: tid -> (its name, user + system CPU seconds, voluntary
    context switches: how often it blocked, i.e. woke up again). {} when the process is
    gone."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = pathlib.Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            status = pathlib.Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        name = stat.split("(", 1)[1].rsplit(")", 1)[0]
        f = stat.rsplit(")", 1)[1].split()
        switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        out[int(tid)] = (name, (int(f[11]) + int(f[12])) / TICK, switches)
    return out


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def broker_pid() -> int | None:
    """The local Kafka broker's JVM (``kafka.Kafka`` on its command line), if any."""
    for pid in _pids():
        try:
            cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"kafka.Kafka\0" in cmd:
            return pid
    return None


def postmaster_pid(dsn: str) -> int | None:
    """The postmaster of the cluster ``dsn`` reaches, when it runs on this machine: the
    parent of a backend of ours."""
    import psycopg2

    conn = psycopg2.connect(dsn)
    try:
        cur = conn.cursor()
        cur.execute("select pg_backend_pid()")
        backend = cur.fetchone()[0]
        f = _stat(backend)
        return int(f[1]) if f is not None else None
    finally:
        conn.close()


def _children_of(ppid: int) -> list[int]:
    out = []
    for pid in _pids():
        f = _stat(pid)
        if f is not None and int(f[1]) == ppid:
            out.append(pid)
    return out


@dataclass
class Usage:
    broker: float | None
    postgres: float | None
    busy: float  # the whole machine: every core's non-idle time
    idle: float

    def __sub__(self, other: "Usage") -> "Usage":
        def d(a, b):
            return None if a is None or b is None else a - b
        return Usage(d(self.broker, other.broker), d(self.postgres, other.postgres),
                     self.busy - other.busy, self.idle - other.idle)

    @staticmethod
    def median(usages: list["Usage"]) -> "Usage":
        """Each part's median over ``usages`` (None where no usage has it)."""
        def m(values):
            values = [v for v in values if v is not None]
            return statistics.median(values) if values else None
        return Usage(m([u.broker for u in usages]), m([u.postgres for u in usages]),
                     m([u.busy for u in usages]), m([u.idle for u in usages]))

    def text(self, per: float = 1.0) -> str:
        """``per``: seconds the figures are divided by."""
        def s(v):
            return "n/a" if v is None else f"{v / per:.2f}"
        share = self.idle / (self.busy + self.idle) if self.busy + self.idle else 0.0
        return (f"broker {s(self.broker)} CPU s, PostgreSQL {s(self.postgres)} CPU s, "
                f"cores idle {share:.0%}")


class Meter:
    def __init__(self, dsn: str | None = None):
        self.broker = broker_pid()
        self.postmaster = postmaster_pid(dsn) if dsn else None

    def _postgres(self) -> float | None:
        if self.postmaster is None:
            return None
        # ended backends are in the postmaster's children's time; the live ones are added
        return cpu_of(self.postmaster, children=True) + sum(
            cpu_of(p) for p in _children_of(self.postmaster))

    def read(self) -> Usage:
        with open("/proc/stat") as fh:
            cpu = [int(v) for v in fh.readline().split()[1:]]
        idle = cpu[3] + cpu[4]  # idle, iowait
        busy = sum(cpu[:8]) - idle  # user nice system idle iowait irq softirq steal
        return Usage(cpu_of(self.broker) if self.broker else None, self._postgres(),
                     busy / TICK, idle / TICK)
