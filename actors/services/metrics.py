"""The router's Prometheus metrics (``prometheus_client``), one registry per command.

Rules:

* Names follow Prometheus conventions: ``pgrouter_…``, base units (bytes, seconds), counters
  end in ``_total`` (the client adds it), labels of low cardinality (route, topic, stage,
  kind, status).
* Nothing is counted per change in Python on the hot path: counters are bumped once per batch
  or per transaction, and values the actors keep anyway (``Stats``, the flush LSN) are read
  when Prometheus scrapes. With ``[metrics] listen`` unset no observer is attached and the
  actors skip the bookkeeping altogether.
* ``pgrouter_lag_seconds`` is how old the oldest routed but not yet confirmed transaction
  is (now − its commit time), 0 when everything routed is confirmed: how far delivery trails
  the source. The slot's lag in bytes comes from the server (``slot_monitor``).
"""

from __future__ import annotations

import collections
import operator
import threading
import time
from typing import Callable

from ..console.board import LagHistory

#: PostgreSQL's epoch (2000-01-01) in Unix seconds: commit times travel in µs since then
PG_EPOCH = 946_684_800
WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")
_TOPIC, _KEY, _VALUE = (operator.itemgetter(i) for i in range(3))


class CommitClock:
    """Commit times of routed transactions by end LSN, dropped once the flush LSN passes them.
    Appended to from the trio thread, read from the HTTP thread: trimming takes the lock."""

    TRIM_EVERY = 1024

    def __init__(self):
        self._pending: collections.deque[tuple[int, int]] = collections.deque()
        self._lock = threading.Lock()
        self._appended = 0
        #: commit time (µs since 2000) of the newest routed transaction
        self.newest = 0
        self.confirmed_lsn: Callable[[], int] = lambda: 0

    def routed(self, end_lsn: int, commit_time_us: int) -> None:
        self._pending.append((end_lsn, commit_time_us))
        self.newest = commit_time_us
        self._appended += 1
        if self._appended % self.TRIM_EVERY == 0:
            self._trim()

    def _trim(self) -> tuple[int, int] | None:
        lsn = self.confirmed_lsn()
        with self._lock:
            pending = self._pending
            while pending and pending[0][0] <= lsn:
                pending.popleft()
            return pending[0] if pending else None

    def lag_seconds(self, now: float | None = None) -> float:
        oldest = self._trim()
        if oldest is None:
            return 0.0
        now = time.time() if now is None else now
        return max(0.0, now - (PG_EPOCH + oldest[1] / 1e6))

    def reset(self) -> None:
        with self._lock:
            self._pending.clear()


class Metrics:
    """Every metric of ``pgrouter run``; the actors receive it as their ``metrics``."""

    def __init__(self):
        # made only with [metrics] listen: a start without it never imports the client
        from prometheus_client import CollectorRegistry, Counter, Gauge, Summary

        self.registry = r = CollectorRegistry(auto_describe=True)
        self.transactions = Counter(
            "pgrouter_transactions", "Transactions read from the slot and routed", registry=r)
        self.changes = Counter(
            "pgrouter_changes", "Row changes (and truncates, messages) read from the slot",
            registry=r)
        self.origin_dropped = Counter(
            "pgrouter_origin_dropped_transactions",
            "Transactions the origin policy kept from every route", registry=r)
        self.route_dropped = Counter(
            "pgrouter_route_dropped_changes",
            "Changes of a table a route carries that its filter or publish actions dropped",
            ["route"], registry=r)
        self.records = Counter(
            "pgrouter_records_produced", "Records handed to Kafka, by route and topic",
            ["route", "topic"], registry=r)
        self.record_bytes = Counter(
            "pgrouter_produced_bytes", "Key and value bytes handed to Kafka, by route and topic",
            ["route", "topic"], registry=r)
        self.restarts = Counter(
            "pgrouter_restarts", "Pipeline restarts after a transient failure, by error kind",
            ["kind"], registry=r)
        self.stage_seconds = Summary(
            "pgrouter_stage_duration_seconds",
            "Time spent per batch in each stage (decode, route, produce)", ["stage"],
            registry=r)
        self.slot_lag_bytes = Gauge(
            "pgrouter_slot_lag_bytes",
            "Server's current WAL position minus the slot's confirmed flush LSN (sampled)",
            registry=r)
        self.slot_retained_bytes = Gauge(
            "pgrouter_slot_retained_wal_bytes",
            "WAL the server keeps for the slot: current position minus restart_lsn (sampled)",
            registry=r)
        self.slot_safe_bytes = Gauge(
            "pgrouter_slot_safe_wal_bytes",
            "WAL that can still be written before the slot is at risk of invalidation "
            "(max_slot_wal_keep_size; NaN when unlimited)", registry=r)
        self.slot_wal_status = Gauge(
            "pgrouter_slot_wal_status", "The slot's wal_status (1 for the current one)",
            ["status"], registry=r)
        self.slot_lag_warning = Gauge(
            "pgrouter_slot_lag_warning",
            "1 while the slot's lag exceeds [metrics] lag_warning_bytes/seconds", registry=r)
        self.last_sample = Gauge(
            "pgrouter_slot_last_sample_timestamp_seconds",
            "When the slot was last sampled over SQL", registry=r)
        self.streaming = Gauge(
            "pgrouter_streaming", "1 while the pipeline streams the slot", registry=r)
        self.snapshot_rows = Counter(
            "pgrouter_snapshot_rows", "Rows read by a snapshot or backfill and routed",
            ["kind", "table"], registry=r)
        self.snapshot_estimated_rows = Gauge(
            "pgrouter_snapshot_estimated_rows",
            "The planner's row estimate of a table being snapshotted", ["kind", "table"],
            registry=r)
        self.snapshot_tables_done = Counter(
            "pgrouter_snapshot_tables_done", "Tables a snapshot or backfill finished",
            ["kind"], registry=r)
        self.clock = CommitClock()
        self._sources: dict[str, Callable[[], float]] = {}
        self._derived(Gauge)
        self._topic_routes: dict[str, str] = {}
        #: for the console: the last slot sample, the lag over the last hour, and per route
        #: the commit time of the newest transaction whose records went to Kafka (µs since
        #: 2000; the router's newest at that moment, so at most one batch ahead)
        self.slot: dict = {}
        self.lag_history = LagHistory()
        self.route_commit: dict[str, int] = {}

    def _derived(self, Gauge) -> None:  # noqa: N803 — prometheus_client's, imported late
        """The gauges read when Prometheus scrapes (what the actors keep anyway)."""
        def gauge(name: str, doc: str, fn: Callable[[], float]) -> None:
            Gauge(name, doc, registry=self.registry).set_function(fn)

        gauge("pgrouter_lag_seconds",
              "Age of the oldest routed transaction Kafka has not yet acknowledged "
              "(0 when none)", self.clock.lag_seconds)
        gauge("pgrouter_records_in_flight", "Records handed to Kafka and not yet acknowledged",
              lambda: self._value("in_flight"))
        gauge("pgrouter_confirmed_flush_lsn",
              "The flush LSN the router last confirmed to the server",
              lambda: self._value("confirmed_lsn"))
        gauge("pgrouter_received_lsn", "The last WAL position received from the server",
              lambda: self._value("received_lsn"))

    def _value(self, name: str) -> float:
        fn = self._sources.get(name)
        return float(fn()) if fn is not None else 0.0

    def bind(self, **sources: Callable[[], float]) -> None:
        """Values read at scrape time from the running pipeline (``in_flight``,
        ``confirmed_lsn``, ``received_lsn``)."""
        self._sources.update(sources)
        if "confirmed_lsn" in sources:
            self.clock.confirmed_lsn = sources["confirmed_lsn"]

    # --- what the actors report ----------------------------------------------------------

    def topic_route(self, topic: str, route: str) -> None:
        self._topic_routes[topic] = route

    def produced(self, records) -> None:
        """One chunk of ``(topic, key, value, …)`` records handed to Kafka (counted with
        C-level iteration: a chunk mostly holds one topic; packed records, an initial
        snapshot's, say their sizes themselves)."""
        routes = self._topic_routes
        sizes = getattr(records, "sizes", None)
        for topic, n, size in (sizes() if sizes is not None else _sizes(records)):
            route = routes.get(topic, "")
            self.route_commit[route] = self.clock.newest
            self.records.labels(route, topic).inc(n)
            self.record_bytes.labels(route, topic).inc(size)

    def routed(self, end_lsn: int, commit_time_us: int, changes: int) -> None:
        self.transactions.inc()
        self.changes.inc(changes)
        self.clock.routed(end_lsn, commit_time_us)

    def sampled_slot(self, *, lag_bytes: int, retained_bytes: int | None,
                     safe_bytes: int | None, wal_status: str | None, warning: bool,
                     **more) -> None:
        """The slot's sample; ``more`` (``active``, ``confirmed_lsn``, ``server_lsn``,
        ``lag_seconds``) is kept for the console only."""
        self.slot = {"lag_bytes": lag_bytes, "retained_wal_bytes": retained_bytes,
                     "safe_wal_bytes": safe_bytes, "wal_status": wal_status,
                     "warning": warning, "sampled_at": time.time(), **more}
        self.lag_history.add(lag_bytes, more.get("lag_seconds", 0.0))
        self.slot_lag_bytes.set(lag_bytes)
        self.slot_retained_bytes.set(retained_bytes if retained_bytes is not None
                                     else float("nan"))
        self.slot_safe_bytes.set(safe_bytes if safe_bytes is not None else float("nan"))
        for status in WAL_STATUSES:
            self.slot_wal_status.labels(status).set(1 if status == wal_status else 0)
        self.slot_lag_warning.set(1 if warning else 0)
        self.last_sample.set(time.time())


#: the metrics of the command running in this process (one ``pgrouter run`` per process), for
#: the parts that are not handed one (the snapshot reporters); None without ``[metrics]``
_active: Metrics | None = None


def activate(metrics: Metrics | None) -> None:
    global _active
    _active = metrics


def active() -> Metrics | None:
    return _active


def _sizes(records: list) -> list[tuple[str, int, int]]:
    """(topic, records, key and value bytes) of each topic of ``records``."""
    topics = collections.Counter(map(_TOPIC, records))
    out = []
    for topic, n in topics.items():
        part = records if len(topics) == 1 else [r for r in records if r[0] == topic]
        out.append((topic, n, sum(map(len, filter(None, map(_VALUE, part)))) + sum(
            map(len, filter(None, map(_KEY, part))))))
    return out
