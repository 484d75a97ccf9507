"""``pgrouter check -c FILE``: check a config against PostgreSQL and Kafka.

Prints every problem found, one per line with the config key path it concerns, and exits 1
if there is any (0 and ``ok`` otherwise): ``wal_level``, what the server's version lacks
(``source.failover`` before 17, a standby before 16: ``actors.pipeline.failover``), the slot (exists or may be created,
pgoutput, not active), the slot's and the routes' publications and tables, replica identities
usable for published UPDATE/DELETE, row filters of UPDATE/DELETE on columns outside the
replica identity, the slot's publications hiding rows, columns, actions or tables a route
needs (``actors.services.catalog.route_problems``), every topic a route can produce
(``actors.services.topic_names``), and Kafka reachable. Before them, one ``mode`` line per
route that follows a publication: ``wal`` (changes of the publication apply at their WAL
position: the event trigger of ``pgrouter setup`` is installed) or ``poll`` (polled;
positions approximate).
"""

from __future__ import annotations

import argparse

import trio
import trio_asyncio

from router.config import Config, load_config
from router.errors import ConfigError, PgRouterError

from ..pipeline import failover
from ..pipeline.definitions_state import mode as publication_mode
from ..services.publication_trigger import installed
from ..services.catalog import load_catalog, route_problems
from ..services.sql import SqlSession
from ..services.topic_names import route_topic_problems

KAFKA_TIMEOUT = 10.0


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", required=True, help="TOML config file")


MODES = {"wal": "publication changes apply at their WAL position (event trigger installed)",
         "poll": "publication changes are polled and apply from when they are noticed: "
                 "positions are approximate (run 'pgrouter setup -c FILE' to install the "
                 "event trigger)"}


async def route_modes(sql: SqlSession, cfg: Config, modes: list,
                      problems: list) -> None:
    try:
        mode = await publication_mode(sql, cfg, install=False)
    except ConfigError as exc:
        problems.append((exc.path or "source.publication_changes", str(exc)))
        return
    note = "" if mode != "wal" or await installed(sql) else (
        " (not installed yet: the router installs it at start, it runs as a superuser)")
    modes.extend(f"mode routes[{i}] ({r.name}): {mode}: {MODES[mode]}{note}"
                 for i, r in enumerate(cfg.routes) if r.publication_names())


async def source_problems(cfg: Config, modes: list | None = None) -> list[tuple[str, str]]:
    src = cfg.source
    out: list[tuple[str, str]] = []
    async with await SqlSession.connect(src.dsn) as sql:
        if modes is not None:
            await route_modes(sql, cfg, modes, out)
        wal_level = await sql.fetchval("select current_setting('wal_level')")
        if wal_level != "logical":
            out.append(("source.dsn", f"wal_level is {wal_level}, logical decoding needs "
                                      "wal_level=logical"))
        version = int(await sql.fetchval("select current_setting('server_version_num')"))
        try:  # what this server version lacks (standby decoding, failover slots)
            await failover.check_server(sql, src, version)
            await failover.check_slot(sql, src, version)
        except ConfigError as exc:
            out.append((exc.path or "source", str(exc).removeprefix(f"{exc.path}: ")))
        db = await sql.fetchval("select current_database()")
        slot = await sql.fetch("select plugin, active, active_pid, database from "
                               "pg_replication_slots where slot_name = $1", src.slot)
        if not slot:
            if not src.create_slot:
                out.append(("source.slot", f"replication slot {src.slot!r} does not exist "
                                           "(and source.create_slot is false)"))
        else:
            s = slot[0]
            if s["plugin"] != "pgoutput":
                out.append(("source.slot", f"slot {src.slot!r} uses plugin {s['plugin']}, "
                                           "not pgoutput"))
            if s["database"] != db:
                out.append(("source.slot", f"slot {src.slot!r} belongs to database "
                                           f"{s['database']}, the DSN connects to {db}"))
            if s["active"]:
                out.append(("source.slot", f"slot {src.slot!r} is in use by process "
                                           f"{s['active_pid']}"))
        catalog = await load_catalog(sql, cfg, strict=False)
    for j, p in enumerate(src.publications):
        if p not in catalog.publications:
            out.append((f"source.publications[{j}]", f"publication {p!r} does not exist"))
    seen = set(out)
    out.extend(p for p in route_problems(cfg, catalog) if p not in seen)
    out.extend(route_topic_problems(cfg, catalog))
    return out


def kafka_problems(cfg: Config) -> list[tuple[str, str]]:
    try:
        from kafka import KafkaAdminClient

        settings = {k: v for k, v in cfg.kafka.settings.items()
                    if k.startswith(("security_", "sasl_", "ssl_", "client_id"))}
        admin = KafkaAdminClient(bootstrap_servers=cfg.kafka.bootstrap_servers,
                                 request_timeout_ms=int(KAFKA_TIMEOUT * 1000), **settings)
        try:
            admin.list_topics()
        finally:
            admin.close()
    except Exception as exc:  # any failure to talk to Kafka is the problem to report
        return [("kafka.bootstrap_servers", f"Kafka not reachable: {exc}")]
    return []


async def _check(cfg: Config, modes: list | None = None) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    async with trio_asyncio.open_loop():
        try:
            problems += await source_problems(cfg, modes)
        except PgRouterError as exc:
            problems.append(("source.dsn", str(exc)))
    problems += await trio.to_thread.run_sync(kafka_problems, cfg)
    return problems


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    modes: list[str] = []
    problems = trio.run(_check, cfg, modes)
    for line in modes:
        print(line)
    for path, message in problems:
        print(f"{path}: {message}")
    if not problems:
        print("ok")
    return 1 if problems else 0
