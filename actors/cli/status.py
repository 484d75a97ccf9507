"""``pgrouter status -c FILE [--json]``: the slot and the routes' topics on one screen.

What it shows, read from the servers (never from a running router, which may be down):
the slot (active, confirmed flush LSN, lag in bytes, WAL retained, ``wal_status``, WAL left
before ``max_slot_wal_keep_size`` would invalidate it), and per route the Kafka topics its
topic template produces with their offsets as the record count (exact unless Kafka
transactions write the topic, ``[kafka] exactly_once`` or ``[ha]``, whose commit markers
take offsets too: then an upper bound, ``records_exact`` false) and the
commit time of the newest record delivered to each (pgrouter's format or Connect's); with
``[ha] enabled`` the leadership group's members and its leader (``actors.ha.group``); the
signals the state topic recorded for the slot (how many accepted and refused, the last ones
with their route, table, where and problem: ``actors.snapshot.signals.recorded``; the
router's own ``recent`` list lives in its process). ``--json`` prints the same as one JSON
object.

Exit status: 0, or 1 when the slot is missing or invalidated or a server cannot be reached
(what could be read is still printed).
"""

from __future__ import annotations

import argparse
import json
import re
import string

import trio
import trio_asyncio

from router.config.router import Config
from router.errors import PgRouterError
from router.postgres.lsn import format_lsn

from ..ha import group
from ..pipeline.slot_monitor import sample_slot
from ..runner.source import Source
from ..kafka.registry import decoder_for
from ..kafka.survey import survey
from ..services.preflight import probe_kafka
from ..snapshot import signals
from ..services import slots
from ..services.sql import SqlSession
from .config_file import load

def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", required=True, help="TOML config file")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")


async def slot_status(source: Source) -> dict:
    slot = source.slot
    async with await SqlSession.connect(source.dsn) as sql:
        sample = await sample_slot(sql, slot)
        version = await sql.fetchval("select current_setting('server_version')")
        pid = await slots.active_pid(sql, slot)
    out: dict = {"name": slot, "exists": sample is not None, "server_version": version}
    if sample is not None:
        out.update(active=sample.active, active_pid=pid,
                   confirmed_flush_lsn=format_lsn(sample.confirmed),
                   server_lsn=format_lsn(sample.current), lag_bytes=sample.lag_bytes,
                   retained_wal_bytes=sample.retained_bytes, wal_status=sample.wal_status,
                   safe_wal_bytes=sample.safe_wal_size)
    return out


def topic_pattern(template: str, route: str) -> re.Pattern:
    """The topics a route's template can produce (``{schema}``/``{table}`` match anything)."""
    parts = []
    for literal, field, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if field == "route":
            parts.append(re.escape(route))
        elif field:
            parts.append(".+")
    return re.compile("".join(parts) + r"\Z")


def kafka_status(cfg: Config) -> dict[str, list[dict]]:
    """route name -> its topics with offsets (record counts without exactly-once) and the
    newest record's commit time."""
    probe_kafka(cfg.kafka.bootstrap_servers)  # an unreachable Kafka says so within seconds
    return survey(cfg.kafka.bootstrap_servers, dict(cfg.kafka.settings),
                  {r.name: topic_pattern(r.outbox.topic if r.outbox else r.topic, r.name).match
                   for r in cfg.routes},
                  cfg.kafka.exactly_once or cfg.ha.enabled,  # [ha]: transactions too
                  decoder=decoder_for(cfg.kafka.registry))


async def _gather(cfg: Config) -> tuple[dict, list[str]]:
    problems: list[str] = []
    source = Source(cfg.source)
    report: dict = {"slot": {"name": source.slot}, "routes": {}, "signals": None}
    async with trio_asyncio.open_loop():
        try:
            report["slot"] = await slot_status(source)
        except PgRouterError as exc:
            # connection failures name their key already (actors.services.sql)
            problems.append(str(exc) if str(exc).startswith("source.dsn: ")
                            else f"source.dsn: {exc}")
    if report["slot"].get("exists") is False:
        problems.append(f"source.slot: replication slot {source.slot!r} does not exist")
    if report["slot"].get("wal_status") == "lost":
        problems.append(f"source.slot: replication slot {source.slot!r} was invalidated "
                        "by the server (wal_status=lost)")
    try:
        report["routes"] = await trio.to_thread.run_sync(kafka_status, cfg)
    except Exception as exc:  # noqa: BLE001 — any failure to talk to Kafka is the report
        why = str(exc).removeprefix("kafka.bootstrap_servers: ").removeprefix(
            "Kafka not reachable: ")
        problems.append(f"kafka.bootstrap_servers: Kafka not reachable: {why}")
    if "kafka.bootstrap_servers" not in " ".join(problems):
        try:
            count, states, last = await trio.to_thread.run_sync(signals.recorded, cfg, source.slot)
            report["signals"] = {"recorded": count, "states": states, "last": last}
        except Exception as exc:  # noqa: BLE001 — any failure to read the topic is the report
            problems.append(f"snapshot.state_topic: the signals cannot be read: {exc}")
    if cfg.ha.enabled:
        try:
            report["ha"] = await trio.to_thread.run_sync(group.describe_group, cfg,
                                                     source.slot)
        except Exception as exc:  # noqa: BLE001 — any failure to talk to Kafka is the report
            problems.append(f"ha: the leadership group cannot be described: {exc}")
    times = [t["last_commit_time"] for ts in report["routes"].values() for t in ts
             if t["last_commit_time"]]
    report["last_delivered_commit_time"] = max(times) if times else None
    report["problems"] = problems
    return report, problems


def _text(report: dict) -> str:
    s = report["slot"]
    lines = [f"slot {s['name']}: " + (
        "missing" if s.get("exists") is False else "unknown" if "exists" not in s else
        f"{'active' if s['active'] else 'inactive'}"
        f"{' (pid ' + str(s['active_pid']) + ')' if s.get('active_pid') else ''}, "
        f"confirmed {s['confirmed_flush_lsn']}, server at {s['server_lsn']}, "
        f"lag {_bytes(s['lag_bytes'])}, WAL retained {_bytes(s['retained_wal_bytes'])}, "
        f"wal_status {s['wal_status']}"
        + (f", {_bytes(s['safe_wal_bytes'])} before invalidation"
           if s.get("safe_wal_bytes") is not None else ""))]
    for route, topics in report["routes"].items():
        lines.append(f"route {route}: {len(topics)} topic(s)")
        for t in topics:
            count = f"{t['records']} records" + ("" if t["records_exact"] else
                                                  " at most (offsets: Kafka transaction "
                                                  "markers included)")
            lines.append(f"  {t['topic']}: {count}, last commit "
                         f"{t['last_commit_time'] or '-'}")
    if report.get("signals"):
        lines.extend(_signal_lines(report["signals"]))
    if report.get("ha"):
        lines.extend(group.text(report["ha"]))
    lines.append(f"last delivered commit: {report['last_delivered_commit_time'] or '-'}")
    lines.extend(report["problems"])
    return "\n".join(lines)


def _signal_lines(sig: dict) -> list[str]:
    if not sig["recorded"]:
        return ["signals: none recorded"]
    counts = ", ".join(f"{n} {state}" for state, n in sig["states"].items())
    lines = [f"signals: {sig['recorded']} recorded ({counts}); the last {len(sig['last'])}:"]
    for s in sig["last"]:
        lines.append(f"  {s['request']}: {s['state']}, route {s['route'] or '-'}, "
                     f"table {s['table'] or 'all'}"
                     + (f", where {s['where']}" if s["where"] else "")
                     + (f": {s['problem']}" if s["problem"] else ""))
    return lines


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def run(args: argparse.Namespace) -> int:
    cfg = load(args.config, "status")
    report, problems = trio.run(_gather, cfg)
    print(json.dumps(report, indent=2) if args.json else _text(report))
    return 1 if problems else 0
