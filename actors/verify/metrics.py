"""``pgrouter verify``'s metrics: ``pgrouter_verify_*`` in Prometheus' text format, served on an
endpoint while verify runs (``[metrics] listen``, or ``--metrics-listen``) and printed in
``--json``'s ``metrics``.

Rules:

* One gauge family per kind, labelled by ``route`` and ``topic``, read when scraped from what
  verify knows then: the results of the topics compared so far (``pgrouter_verify_*_rows``,
  ``_equal``, ``_duration_seconds``), and the work under way: records of the current topic
  read (``pgrouter_verify_records_read``), repairs asked and not yet done
  (``pgrouter_verify_repairs_pending``), ``pgrouter_verify_running`` (1 until the end).
* The endpoint is ``pgrouter run``'s (``actors.services.http.Endpoint``: a daemon thread, so
  a scrape never waits for verify's loop); it answers ``/readyz`` 200 while verify runs.
* The router of the same config usually serves ``[metrics] listen`` itself: an address that
  is taken is one warning line, and verify runs on without an endpoint (``--metrics-listen``
  names another address); a bad address is a ``ConfigError``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from router.config.router import parse_listen
from router.errors import ConfigError

if TYPE_CHECKING:  # prometheus_client and the HTTP endpoint load when served or printed
    from ..services.http import Endpoint

KINDS = ("compared", "missing", "extra", "different", "kept")


class VerifyMetrics:
    """What verify knows so far, as a Prometheus collector (``registry``, made when first
    asked for: ``prometheus_client`` loads only for an endpoint or ``--json``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.results: dict[tuple[str, str], object] = {}  # (route, topic) -> Comparison
        self.read: dict[tuple[str, str], int] = {}
        self.pending = 0
        self.running = 1
        self._registry = None

    @property
    def registry(self):
        if self._registry is None:
            from prometheus_client import CollectorRegistry

            self._registry = CollectorRegistry(auto_describe=False)
            self._registry.register(self)
        return self._registry

    def result(self, r) -> None:
        with self._lock:
            self.results[(r.route, r.topic)] = r

    def records_read(self, route: str, topic: str, n: int) -> None:
        with self._lock:
            self.read[(route, topic)] = n

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            results, read = list(self.results.values()), dict(self.read)
            pending, running = self.pending, self.running
        labels = ["route", "topic"]
        for kind in KINDS:
            g = GaugeMetricFamily(f"pgrouter_verify_{kind}_rows",
                                  f"Rows {kind} by the last verify of the topic", labels=labels)
            for r in results:
                g.add_metric([r.route, r.topic], getattr(r, kind))
            yield g
        eq = GaugeMetricFamily("pgrouter_verify_equal", "1: the topic held what the source "
                               "does at the verify point; 0: it differed", labels=labels)
        dur = GaugeMetricFamily("pgrouter_verify_duration_seconds",
                                "Seconds the topic's comparison took", labels=labels)
        for r in results:
            eq.add_metric([r.route, r.topic], int(r.ok))
            dur.add_metric([r.route, r.topic], r.seconds)
        yield eq
        yield dur
        g = GaugeMetricFamily("pgrouter_verify_records_read",
                              "Records of the topic read so far", labels=labels)
        for (route, topic), n in read.items():
            g.add_metric([route, topic], n)
        yield g
        yield GaugeMetricFamily("pgrouter_verify_repairs_pending",
                                "Repairs asked of the router and not yet done", value=pending)
        yield GaugeMetricFamily("pgrouter_verify_running", "1 while verify runs",
                                value=running)

    def text(self) -> str:
        """The metrics in Prometheus' text format (``--json``'s ``metrics``)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()


def serve(listen: str, metrics: VerifyMetrics, warn, path: str) -> Endpoint | None:
    """The endpoint on ``listen`` (``host:port``; port 0: any free one), or None with one
    warning line when the address is taken; ``ConfigError`` naming ``path`` for a bad one."""
    from ..services.http import Endpoint, Health

    host, port = parse_listen(listen, path=path)
    health = Health()
    health.set(True, "verify runs")
    try:
        return Endpoint(host, port, metrics.registry, health)
    except ConfigError as exc:
        if "in use" not in str(exc):
            raise ConfigError(str(exc).removeprefix("metrics.listen: "), path=path) from None
        warn(f"{path}: {listen} is in use (the router's own endpoint?): verify's metrics are "
             "not served (--metrics-listen HOST:PORT serves them elsewhere)")
        return None
