"""``pgrouter check -c FILE``: check a config against PostgreSQL and Kafka.

Prints every finding of ``actors.services.preflight`` (the checks ``pgrouter run`` refuses
to start on), one per line with the config key path it concerns, and exits 1 if there is an
error (0 and ``ok`` otherwise; warnings, such as an existing topic whose partitions or
configs differ from ``topic_settings``, are printed but do not fail the check). Topic names
are among the findings (``actors.services.topic_names``). A service that cannot be reached,
or refuses the login, is a finding too: ``check`` never ends in a traceback. Before them, one
``mode`` line per route that follows a publication: ``wal`` (changes of the publication apply
at their WAL position: the event trigger of ``pgrouter setup`` is installed) or ``poll``
(polled; positions approximate).
"""

from __future__ import annotations

import argparse

import trio
import trio_asyncio

from router.config.router import Config
from router.errors import ConfigError, PgRouterError

from ..runner.source import Source
from ..services.publication_mode import mode as publication_mode
from ..services import preflight
from ..services.publication_trigger import installed
from ..services.retry import primary
from ..services.sql import SqlSession
from .config_file import load

MODES = {"wal": "publication changes apply at their WAL position (event trigger installed)",
         "poll": "publication changes are polled and apply from when they are noticed: "
                 "positions are approximate (run 'pgrouter setup -c FILE' to install the "
                 "event trigger)"}


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", required=True, help="TOML config file")


async def route_modes(sql: SqlSession, cfg: Config, slot: str, modes: list,
                      problems: list) -> None:
    try:
        mode = await publication_mode(sql, cfg, slot, install=False)
    except ConfigError as exc:
        problems.append(preflight.Finding(exc.path or "source.publication_changes", str(exc)))
        return
    note = "" if mode != "wal" or await installed(sql) else (
        " (not installed yet: the router installs it at start, it runs as a superuser)")
    modes.extend(f"mode routes[{i}] ({r.name}): {mode}: {MODES[mode]}{note}"
                 for i, r in enumerate(cfg.routes) if r.publication_names())


async def _source(cfg: Config, modes: list) -> tuple[list[preflight.Finding], object]:
    try:
        async with trio_asyncio.open_loop():
            source = Source(cfg.source)
            async with await SqlSession.connect(source.dsn) as sql:
                problems: list[preflight.Finding] = []
                await route_modes(sql, cfg, source.slot, modes, problems)
                findings, catalog = await preflight.source_findings(sql, cfg, source.slot)
                return problems + findings, catalog
    except BaseException as exc:  # noqa: BLE001 — reduced to the one error that explains it
        cause = primary(exc)
        if not isinstance(cause, PgRouterError):
            raise cause from exc  # a bug: its own traceback, not a group's
        message = str(cause)
        path, sep, rest = message.partition(": ")
        if not sep or " " in path:
            path, rest = "source.dsn", message
        return [preflight.Finding(path, rest)], None


def _kafka(cfg: Config, catalog) -> list[preflight.Finding]:
    try:
        return preflight.kafka_findings(cfg, preflight.planned_topics(cfg, catalog))
    except PgRouterError as exc:
        message = str(exc).removeprefix("kafka.bootstrap_servers: ")
        return [preflight.Finding("kafka.bootstrap_servers", message)]


async def _check(cfg: Config, modes: list) -> list[preflight.Finding]:
    findings, catalog = await _source(cfg, modes)
    findings += preflight.local_findings(cfg)
    findings += await trio.to_thread.run_sync(_kafka, cfg, catalog)
    findings += await trio.to_thread.run_sync(preflight.registry_findings, cfg)
    return findings


def run(args: argparse.Namespace) -> int:
    cfg = load(args.config, "check")
    modes: list[str] = []
    findings = trio.run(_check, cfg, modes)
    for line in modes:
        print(line)
    for finding in findings:
        print(finding.line())
    errors = [f for f in findings if not f.warning]
    if not errors:
        print("ok")
    return 1 if errors else 0
