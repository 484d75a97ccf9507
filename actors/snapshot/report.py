"""Progress lines of a snapshot or backfill: per table rows done / estimated total, rate and
ETA every ``interval`` seconds, and a summary line per table at the end. The estimate is the
planner's ``reltuples`` (0 when the table was never analyzed: then no ETA)."""

from __future__ import annotations

import time

import trio

from router.snapshot.core import eta

from ..console import board
from ..services import log, metrics

_log = log.get("snapshot")


class _Table:
    __slots__ = ("estimate", "rows", "started", "finished", "last_rows", "last_time")

    def __init__(self, estimate: int):
        self.estimate = estimate
        self.rows = 0
        self.started = time.monotonic()
        self.finished: float | None = None
        self.last_rows = 0
        self.last_time = self.started


class Reporter:
    def __init__(self, what: str, interval: float = 10.0):
        self.what = what  # "initial snapshot" / "backfill"
        self.interval = interval
        self.tables: dict[str, _Table] = {}
        self.kind = "initial" if what.startswith("initial") else "backfill"  # metric label
        board.jobs.add(self)  # the console's progress bars read ``tables``

    def start(self, table: str, estimate: int) -> None:
        self.tables[table] = _Table(estimate)
        if (m := metrics.active()) is not None:
            m.snapshot_estimated_rows.labels(self.kind, table).set(estimate)
        log.event(_log, f"{self.what}: table started", table=table, estimated_rows=estimate)

    def add(self, table: str, rows: int) -> None:
        self.tables[table].rows += rows
        if (m := metrics.active()) is not None:
            m.snapshot_rows.labels(self.kind, table).inc(rows)

    def finish(self, table: str) -> None:
        t = self.tables[table]
        t.finished = time.monotonic()
        if (m := metrics.active()) is not None:
            m.snapshot_tables_done.labels(self.kind).inc()
        secs = max(t.finished - t.started, 1e-6)
        log.event(_log, f"{self.what}: table done", table=table, rows=t.rows,
                  seconds=round(secs, 2), rows_per_s=round(t.rows / secs, 1))

    def line(self) -> None:
        now = time.monotonic()
        for name, t in self.tables.items():
            if t.finished is not None:
                continue
            rate = (t.rows - t.last_rows) / max(now - t.last_time, 1e-6)
            t.last_rows, t.last_time = t.rows, now
            left = eta(t.rows, t.estimate, rate)
            log.event(_log, f"{self.what}: progress", table=name, rows=t.rows,
                      estimated_rows=t.estimate,
                      percent=round(100 * t.rows / t.estimate, 1) if t.estimate else None,
                      rows_per_s=round(rate, 1),
                      eta_s=None if left is None else round(left, 1))

    def summary(self) -> None:
        total = sum(t.rows for t in self.tables.values())
        start = min((t.started for t in self.tables.values()), default=time.monotonic())
        secs = max(time.monotonic() - start, 1e-6)
        log.event(_log, f"{self.what}: done", tables=len(self.tables), rows=total,
                  seconds=round(secs, 2), rows_per_s=round(total / secs, 1))

    async def run(self) -> None:
        """Progress lines until cancelled."""
        while True:
            await trio.sleep(self.interval)
            self.line()
