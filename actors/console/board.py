"""What the console shows that no metric holds: the last warnings and errors, the snapshot and
backfill jobs, rates over the last seconds and the slot's lag over the last hour.

Rules: written from the trio thread (or a logging call anywhere), read from the HTTP thread;
every structure is bounded (``RECENT`` lines, ``JOBS`` reporters, an hour of lag points) and
read by copying (``list(…)``), so a reader never blocks a writer for longer than a copy.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

#: warnings and errors kept for the page
RECENT = 100
#: snapshot/backfill reporters kept (running and finished)
JOBS = 20
#: seconds of slot lag kept for the sparkline, and the spacing of its points
HISTORY_SECONDS = 3600.0
HISTORY_STEP = 1.0
#: seconds over which records/s and bytes/s are averaged
RATE_WINDOW = 5.0


class RecentProblems(logging.Handler):
    """A logging handler keeping the last ``RECENT`` warnings and errors as plain dicts."""

    def __init__(self, size: int = RECENT):
        super().__init__(level=logging.WARNING)
        self.lines: collections.deque[dict] = collections.deque(maxlen=size)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = {k: (v if isinstance(v, (int, float, bool)) or v is None else str(v))
                      for k, v in getattr(record, "fields", {}).items()}
            self.lines.append({"ts": record.created, "level": record.levelname.lower(),
                               "logger": record.name, "msg": record.getMessage(),
                               "fields": fields})
        except Exception:  # noqa: BLE001 — logging must never raise into the caller
            self.handleError(record)

    def snapshot(self) -> list[dict]:
        return list(self.lines)


class LagHistory:
    """(time, lag bytes, lag seconds) at most every ``HISTORY_STEP`` s for the last hour."""

    def __init__(self):
        self.points: collections.deque[tuple[float, int, float]] = collections.deque()

    def add(self, lag_bytes: int, lag_seconds: float, now: float | None = None) -> None:
        now = time.time() if now is None else now
        points = self.points
        if points and now - points[-1][0] < HISTORY_STEP:
            points[-1] = (points[-1][0], max(points[-1][1], lag_bytes),
                          max(points[-1][2], lag_seconds))
        else:
            points.append((now, lag_bytes, lag_seconds))
        while points and points[0][0] < now - HISTORY_SECONDS:
            points.popleft()

    def snapshot(self) -> list[list]:
        return [[round(t, 1), b, round(s, 3)] for t, b, s in list(self.points)]


class Rates:
    """Per key (route) totals seen by successive readers -> a rate over ``RATE_WINDOW``."""

    def __init__(self):
        self._seen: dict[str, collections.deque] = {}
        self._lock = threading.Lock()

    def rate(self, key: str, total: float, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            seen = self._seen.setdefault(key, collections.deque())
            seen.append((now, total))
            while len(seen) > 2 and seen[1][0] <= now - RATE_WINDOW:
                seen.popleft()
            t0, v0 = seen[0]
        return (total - v0) / (now - t0) if now - t0 > 0.05 else 0.0


class Jobs:
    """The snapshot and backfill reporters (``actors.snapshot.report.Reporter``)."""

    def __init__(self):
        self.reporters: collections.deque = collections.deque(maxlen=JOBS)

    def add(self, reporter) -> None:
        """A new reporter supersedes the earlier ones of its kind: a pipeline restart makes a
        new backfill stage, which resumes the unfinished tables of the one before."""
        for old in [r for r in list(self.reporters) if r.kind == reporter.kind]:
            self.reporters.remove(old)
        self.reporters.append(reporter)

    def snapshot(self, eta) -> list[dict]:
        out = []
        now = time.monotonic()
        for rep in list(self.reporters):
            for _ in range(3):  # a table added while copying: read again
                try:
                    tables = list(rep.tables.items())
                    break
                except RuntimeError:
                    continue
            else:
                tables = []
            for name, t in tables:
                end = t.finished if t.finished is not None else now
                rate = t.rows / max(end - t.started, 1e-6)
                done = t.finished is not None
                left = None if done else eta(t.rows, t.estimate, rate)
                out.append({"kind": rep.kind, "table": name, "rows": t.rows,
                            "estimated_rows": t.estimate, "done": done,
                            "percent": (100.0 if done else
                                        round(min(99.9, 100 * t.rows / t.estimate), 1)
                                        if t.estimate else None),
                            "rows_per_s": round(rate, 1),
                            "eta_s": None if left is None else round(left, 1)})
        return out


def state(health, restarts: int = 0) -> dict:
    """Ready or not (``services.http.Health``), and the newest warning or error logged since
    it stopped being ready: the page's current problem, gone once it is ready again."""
    ready, reason = health.state()
    problem = None
    if not ready:
        recent = [p for p in problems.snapshot() if p["ts"] >= health.changed_at]
        problem = recent[-1] if recent else None
    return {"ready": ready, "reason": reason, "since": health.changed_at,
            "restarts": restarts, "problem": problem}


#: the process's board (one command per process, as ``services.metrics.active``)
problems = RecentProblems()
jobs = Jobs()
