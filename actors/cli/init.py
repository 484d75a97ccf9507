"""``pgrouter init --dsn DSN [--kafka HOST:PORT] [--slot NAME] [-o FILE] [--force]``: ask a
live PostgreSQL (and, when given, Kafka) and write a commented starter config.

What it writes: the slot, streaming every publication of the database, one route per
publication (each topic then holds exactly what that publication would replicate), the Kafka
bootstrap, snapshot mode ``initial`` and metrics off. The file passes ``pgrouter check`` as
written when the server and Kafka are as they were asked.

Rules: it never overwrites a file without ``--force``; a DSN that does not connect, a role
without the REPLICATION attribute, a database without publications and an unreachable Kafka
are each one line on stderr and exit 1, with nothing written. It only reads the catalog.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys

from router.config import parse_config
from router.dsn import mask
from router.kafka_settings import parse_bootstrap_servers

_ROUTE_NAME = re.compile(r"[^A-Za-z0-9._\-]")
DEFAULT_KAFKA = "127.0.0.1:9092"


class InitError(Exception):
    """One line for the user; nothing was written."""


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dsn", required=True, help="libpq URI or key=value string of the source "
                   "PostgreSQL (the role needs the REPLICATION attribute)")
    p.add_argument("--kafka", metavar="HOST:PORT[,…]",
                   help=f"Kafka bootstrap servers, checked for reachability (default: "
                        f"{DEFAULT_KAFKA}, not checked)")
    p.add_argument("--slot", default="pgrouter", help="replication slot name (default: pgrouter)")
    p.add_argument("-o", "--output", default="pgrouter.toml",
                   help="file to write (default: pgrouter.toml)")
    p.add_argument("--force", action="store_true", help="overwrite the file when it exists")


def _connect(dsn: str):
    import psycopg2

    try:
        return psycopg2.connect(dsn, connect_timeout=10)
    except psycopg2.Error as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise InitError(f"cannot connect to {mask(dsn)}: {reason}") from None


def inspect(dsn: str) -> dict:
    """What the starter config is made from: the database, the role's rights, wal_level,
    every publication with its tables, row filters and column lists."""
    conn = _connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("select current_database(), current_user, "
                        "(select rolreplication or rolsuper from pg_roles "
                        " where rolname = current_user), current_setting('wal_level'), "
                        "current_setting('server_version_num')::int")
            db, user, may_replicate, wal_level, version = cur.fetchone()
            cur.execute("select pubname, puballtables, pubinsert, pubupdate, pubdelete, "
                        "pubtruncate, pubviaroot from pg_publication order by pubname")
            pubs = {r[0]: {"all_tables": r[1], "actions": [a for a, on in zip(
                ("insert", "update", "delete", "truncate"), r[2:6]) if on],
                "via_root": r[6], "tables": []} for r in cur.fetchall()}
            # attnames names every column when the publication has no column list
            cur.execute("select pubname, schemaname, tablename, rowfilter, attnames, "
                        "cardinality(attnames) < (select count(*) from pg_attribute a where "
                        "a.attrelid = format('%I.%I', schemaname, tablename)::regclass and "
                        "a.attnum > 0 and not a.attisdropped) "
                        "from pg_publication_tables order by 1, 2, 3")
            for pub, schema, table, rowfilter, attnames, listed in cur.fetchall():
                pubs[pub]["tables"].append((schema, table, rowfilter,
                                            attnames if listed else None))
            cur.execute("select distinct n.nspname from pg_class c join pg_namespace n "
                        "on n.oid = c.relnamespace where c.relkind in ('r', 'p') and "
                        "n.nspname not in ('pg_catalog', 'information_schema') and "
                        "n.nspname not like 'pg\\_%' and n.nspname <> 'pgrouter' order by 1")
            schemas = [r[0] for r in cur.fetchall()]
    finally:
        conn.close()
    if not may_replicate:
        raise InitError(f"role {user!r} has no REPLICATION attribute: a logical replication "
                        f"slot needs it (ALTER ROLE {user} REPLICATION, as a superuser)")
    if not pubs:
        tables = ", ".join(schemas) if schemas else "public"
        raise InitError(f"database {db!r} has no publication: pgrouter streams what "
                        f"publications cover; create one first, e.g. CREATE PUBLICATION "
                        f"pgrouter_all FOR TABLES IN SCHEMA {tables}")
    return {"db": db, "user": user, "wal_level": wal_level, "version": version, "pubs": pubs}


def check_kafka(bootstrap: str) -> None:
    """Reachable means a TCP connection to at least one bootstrap server."""
    reasons = []
    for host, port in parse_bootstrap_servers(bootstrap):
        try:
            with socket.create_connection((host, port), timeout=3):
                return
        except OSError as exc:
            reasons.append(f"{host}:{port}: {exc.strerror or exc}")
    raise InitError(f"cannot reach Kafka at {bootstrap} ({'; '.join(reasons)})")


def _describe(pub: dict) -> list[str]:
    if pub["all_tables"]:
        what = ["every table of the database"]
    else:
        what = []
        for schema, table, rowfilter, attnames in pub["tables"][:5]:
            extra = [f"where {rowfilter}"] if rowfilter else []
            if attnames:
                extra.append(f"columns {', '.join(attnames)}")
            what.append(f"{schema}.{table}" + (f" ({'; '.join(extra)})" if extra else ""))
        if len(pub["tables"]) > 5:
            what.append(f"and {len(pub['tables']) - 5} more")
        what = what or ["no tables yet"]
    return [f"#   {w}" for w in what] + [
        f"#   actions: {', '.join(pub['actions'])}"
        + ("; partitions published as their root" if pub["via_root"] else "")]


def slot_publications(pubs: dict) -> list[str]:
    """What the slot streams: PostgreSQL refuses to stream one table with two different column
    lists on one slot, so publications with column lists are left out where publications
    without one already cover their tables (the routes re-apply each column list)."""
    whole = [p for p, d in pubs.items() if all(t[3] is None for t in d["tables"])]
    covered_all = any(pubs[p]["all_tables"] for p in whole)
    covered = {(t[0], t[1]) for p in whole for t in pubs[p]["tables"]}
    out = list(whole)
    for p, d in pubs.items():
        if p not in whole and not covered_all and not {(t[0], t[1]) for t in d["tables"]} <= covered:
            out.append(p)
    return sorted(out)


def render(info: dict, *, dsn: str, kafka: str | None, slot: str) -> str:
    names: set[str] = set()
    routes = []
    for pub in info["pubs"]:
        name = _ROUTE_NAME.sub("_", pub) or "route"
        while name in names:
            name += "_"
        names.add(name)
        routes += ["", f"# what publication {pub!r} would replicate, one topic per table:",
                   *_describe(info["pubs"][pub]), "[[routes]]", f"name = {json.dumps(name)}",
                   f"publication = {json.dumps(pub)}", 'topic = "{route}.{schema}.{table}"']
    warn = []
    if info["wal_level"] != "logical":
        warn = [f"# NOTE: the server runs wal_level = {info['wal_level']}; logical replication "
                "needs wal_level = logical", "# (postgresql.conf, then a restart)."]
    lines = [
        f"# pgrouter: written by `pgrouter init` for database {info['db']!r} "
        f"(PostgreSQL {info['version'] // 10000}).",
        "# Check it:  pgrouter check -c FILE      Run it:  pgrouter run -c FILE",
        "# Every key, its default and meaning: docs/configuration.md",
        *warn,
        "",
        "[source]",
        f"# libpq URI or key=value string; role {info['user']!r} has the REPLICATION attribute",
        f"dsn = {json.dumps(dsn)}",
        "# the one logical replication slot every route is fed from (created by the first run)",
        f"slot = {json.dumps(slot)}",
        "# what the slot streams: the union of these publications (at least as wide as every",
        "# route; each route re-applies its own publication's filter and columns)",
        f"publications = {json.dumps(slot_publications(info['pubs']))}",
        "create_slot = true",
        "",
        "[kafka]",
        "# host:port, comma-separated" + ("" if kafka else " (not checked: give --kafka to check it)"),
        f"bootstrap_servers = {json.dumps(kafka or DEFAULT_KAFKA)}",
        "",
        "[snapshot]",
        '# "initial": when the router creates the slot it first copies every routed table into',
        '# the topics (op "r" records); "never": only changes from then on',
        'mode = "initial"',
        "",
        "[metrics]",
        '# host:port of /metrics, /healthz and /readyz, e.g. "127.0.0.1:9187" ("": off)',
        'listen = ""',
        *routes,
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    try:
        if os.path.exists(args.output) and not args.force:
            raise InitError(f"{args.output} exists: pass --force to overwrite it")
        info = inspect(args.dsn)
        if args.kafka:
            check_kafka(args.kafka)
        text = render(info, dsn=args.dsn, kafka=args.kafka, slot=args.slot)
        parse_config(text, source=args.output)  # what it writes loads as it is
        with open(args.output, "w") as fh:
            fh.write(text)
    except InitError as exc:
        print(f"pgrouter init: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"pgrouter init: cannot write {args.output}: {exc.strerror}", file=sys.stderr)
        return 1
    routes = len(info["pubs"])
    print(f"wrote {args.output}: slot {args.slot!r}, {routes} route(s), one per publication "
          f"({', '.join(sorted(info['pubs']))}); next: pgrouter check -c {args.output}")
    return 0
