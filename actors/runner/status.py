"""The HTTP endpoint of ``pgrouter run`` (``open_endpoint``): its start line, and
``/api/status``: one JSON document built on the HTTP thread from what
the supervisor and its actors published (``Metrics``, ``Stats``, ``Health``, the console's
board), never by waiting for the trio loop. Its schema (``SCHEMA``, tested) is documented in
docs/console.md; ``describe_routes`` reads, once per pipeline start, each route's tables with
their row filter and column list as PostgreSQL prints them (``pg_publication_tables``).
"""

from __future__ import annotations

import time
from logging import WARNING

import trio

from router import __version__
from router.config.router import parse_listen
from router.config.console import redacted
from router.errors import PgRouterError
from router.snapshot.core import eta

from ..console import board
from ..console.web import Console
from ..services import log
from ..services.http import Endpoint
from ..services.metrics import PG_EPOCH
from ..snapshot import signals
from ..snapshot.request import request

_log = log.get("supervisor")  # its lines are the supervisor's
#: the document's version (bumped when a field changes meaning or goes away)
SCHEMA = 1

PUBLICATION_TABLES = """
select pubname, schemaname || '.' || tablename as "table", rowfilter, attnames::text[] as columns
from pg_publication_tables where pubname = any($1::text[]) order by 1, 2
"""


async def describe_routes(sql, cfg) -> dict[str, dict]:
    """route name -> what it carries: its publications or tables and, per table, the row
    filter and column list (PostgreSQL's own text for publications)."""
    pubs = sorted({p for r in cfg.routes for p in r.publication_names()})
    rows = await sql.fetch(PUBLICATION_TABLES, pubs) if pubs else []
    out = {}
    for r in cfg.routes:
        names = r.publication_names()
        if names:
            tables = [{"table": row["table"], "row_filter": row["rowfilter"],
                       "columns": list(row["columns"] or []), "publication": row["pubname"]}
                      for row in rows if row["pubname"] in names]
            source = {"publications": names}
        elif r.tables:
            tables = [{"table": t, "row_filter": r.where or None, "columns": list(r.columns),
                       "publication": None} for t in r.tables]  # the same fields as above
            source = {"tables": list(r.tables)}
        else:
            tables = []
            source = {"schemas": list(r.schemas)} if r.schemas else {"all_tables": True}
        out[r.name] = {"source": source, "tables": tables, "operations": list(r.operations),
                       "topic": r.topic}
    return out


def _by_route(counter) -> dict[str, dict[str, float]]:
    """route -> topic -> value of a Counter labelled (route, topic)."""
    out: dict[str, dict[str, float]] = {}
    for family in counter.collect():
        for s in family.samples:
            if s.name.endswith("_total"):
                out.setdefault(s.labels.get("route", ""), {})[s.labels.get("topic", "")] = s.value
    return out


def _per_label(counter, label: str) -> dict[str, float]:
    return {s.labels[label]: s.value for family in counter.collect() for s in family.samples
            if s.name.endswith("_total")}


def _commit_time(us: int | None) -> str | None:
    if not us:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(PG_EPOCH + us / 1e6)) + "Z"


def run_status(sup) -> dict:
    cfg, m, stats = sup.cfg, sup.metrics, sup.stats
    views = getattr(sup, "route_views", None) or {}
    records, sizes = _by_route(m.records), _by_route(m.record_bytes)
    dropped = _per_label(m.route_dropped, "route")
    rates = sup.rates
    routes = []
    for r in cfg.routes:
        topics = records.get(r.name, {})
        n, size = sum(topics.values()), sum(sizes.get(r.name, {}).values())
        view = views.get(r.name, {"source": {}, "tables": [], "operations": list(r.operations),
                                  "topic": r.topic})
        routes.append({"name": r.name, **view,
                       "topics": [{"topic": t, "records": int(v),
                                   "bytes": int(sizes.get(r.name, {}).get(t, 0))}
                                  for t, v in sorted(topics.items())],
                       "records": int(n), "bytes": int(size),
                       "records_per_s": round(rates.rate(r.name + "/records", n), 1),
                       "bytes_per_s": round(rates.rate(r.name + "/bytes", size), 1),
                       "last_commit_time": _commit_time(m.route_commit.get(r.name)),
                       "dropped": int(dropped.get(r.name, 0))})
    slot = {"name": sup.source.slot, "active": None, "confirmed_lsn": None, "server_lsn": None,
            "lag_bytes": None,
            "retained_wal_bytes": None, "wal_status": None, "safe_wal_bytes": None,
            "sampled_at": None, **{k: v for k, v in m.slot.items() if k != "warning"},
            "lag_warning": bool(m.slot.get("warning")),
            "history": m.lag_history.snapshot()}
    slot["lag_seconds"] = round(m.clock.lag_seconds(), 3)
    restarts = int(sum(_per_label(m.restarts, "kind").values()))
    return {"schema": SCHEMA, "kind": "run", "version": __version__, "name": sup.source.slot,
            "now": time.time(),
            "state": board.state(sup.health, restarts),
            "slot": slot, "routes": routes, "jobs": board.jobs.snapshot(eta),
            "signals": signals.status(),
            "kafka": {"client": cfg.kafka.client,
                      "delivery": "exactly-once" if cfg.kafka.exactly_once else "at-least-once",
                      "format": cfg.kafka.format,
                      "bootstrap_servers": redacted(cfg.kafka)["bootstrap_servers"],
                      "in_flight": max(0, stats.sent_records - stats.acked_records)},
            "problems": board.problems.snapshot(),
            "ha": sup.leadership.describe() if getattr(sup, "leadership", None) else None,
            "config": redacted(cfg)}


def open_endpoint(sup) -> Endpoint:
    """The supervisor's endpoint (``[metrics] listen``): the metrics, /readyz and the
    console, answering from now on; its start line logged."""
    cfg = sup.cfg
    host, port = parse_listen(cfg.metrics.listen)
    console = Console(cfg.console, lambda: run_status(sup), backfill_action(cfg, sup.source.slot))
    endpoint = Endpoint(host, port, sup.metrics.registry, sup.health, console=console,
                        cfg=cfg.console)
    listening(endpoint, cfg.console)
    return endpoint


def backfill_action(cfg, slot: str):
    """The console's backfill button: the request ``pgrouter snapshot`` writes to ``slot``, on the
    calling (HTTP request) thread with its own trio loop and SQL session."""
    def start(routes: list[str], tables: list[str]) -> tuple[str, list, list[str]]:
        if not cfg.source.messages:
            return "", [], ["source.messages: backfills need logical messages (the watermarks)"]
        try:
            return trio.run(request, cfg, slot, routes, tables)
        except PgRouterError as exc:
            return "", [], [str(exc)]
    return start


def listening(endpoint: Endpoint, console) -> None:
    """The endpoint's start line, and a warning when it answers beyond this machine without
    credentials (the console shows the configuration, secrets taken out)."""
    host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
    base = f"{endpoint.scheme}://{host}:{endpoint.port}"
    log.event(_log, "metrics endpoint listening", url=f"{base}/metrics",
              console=f"{base}/" if console.enabled else None)
    if (console.enabled and not (console.token or console.username)
            and endpoint.host not in ("127.0.0.1", "::1", "localhost")):
        log.event(_log, "the console answers anyone who reaches this address: set [console] "
                  "token or username/password", level=WARNING, listen=f"{host}:{endpoint.port}")
