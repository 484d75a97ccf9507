"""The applier's Prometheus metrics: its counters read when Prometheus scrapes (nothing is
counted twice or on the write path).

Rules: names ``pgrouter_apply_…`` in base units; conflicts are labelled by the configured
``policy`` and the conflict ``kind``; lag is exported as the commit time of the last applied
source transaction (``pgrouter_apply_last_commit_timestamp_seconds``: alert on
``time() - …``) and the replication origin's progress LSN.
"""

from __future__ import annotations

from datetime import datetime

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class ApplyCollector:
    def __init__(self, applier):
        self.applier = applier

    def collect(self):
        a = self.applier
        s, reader, ra = a.stats, a._reader, a._reassembler
        yield _counter("pgrouter_apply_transactions", "Source transactions applied",
                       s.transactions)
        yield _counter("pgrouter_apply_changes", "Changes applied", s.changes)
        yield _counter("pgrouter_apply_skipped_transactions",
                       "Source transactions skipped as already applied (the origin's progress)",
                       s.skipped + (ra.skipped if ra else 0))
        yield _counter("pgrouter_apply_fetched_records", "Records read from Kafka",
                       s.fetched + (reader.fetched if reader else 0))
        conflicts = CounterMetricFamily("pgrouter_apply_conflicts",
                                        "Changes that did not fit the target's rows",
                                        labels=["policy", "kind"])
        for kind, n in sorted(s.conflicts.items()):
            conflicts.add_metric([a.cfg.target.conflict, kind], n)
        yield conflicts
        last = getattr(s, "last_commit_time", None)
        yield _gauge("pgrouter_apply_last_commit_timestamp_seconds",
                     "Commit time of the last applied source transaction (Unix seconds)",
                     _unix(last) if last else float("nan"))
        yield _gauge("pgrouter_apply_origin_progress_lsn",
                     "The replication origin's progress: end of the last applied transaction",
                     float(getattr(s, "progress_lsn", 0) or 0))
        yield _gauge("pgrouter_apply_streaming", "1 while the applier applies",
                     1.0 if a.health.state()[0] else 0.0)


def registry_for(applier) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ApplyCollector(applier))
    return registry


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _unix(commit_time: str) -> float:
    try:
        return datetime.fromisoformat(commit_time).timestamp()
    except ValueError:
        return float("nan")
