"""``pgrouter init --dsn DSN [--kafka HOST:PORT] [--slot NAME] [-o FILE] [--force]``: ask a
live PostgreSQL (and, when given, Kafka) and write a commented starter config.

What it writes: the slot, streaming the publications of the database (``slot_plan``), one
route per publication (each topic then holds exactly what that publication would replicate),
the Kafka bootstrap, snapshot mode ``initial`` and metrics off. The file passes ``pgrouter
check`` as written when the server and Kafka are as they were asked: a publication whose
route the slot cannot feed (a column list that clashes, on one table, with a publication
that filters rows) gets its route commented out, with what to do, and a line on stdout.
Names and filters are written as the catalog spells them: TOML strings escaped, comments on
one line whatever newlines a name or a filter literal holds.

Rules: it never overwrites a file without ``--force``; a DSN that does not connect, a role
without the REPLICATION attribute, a database without publications and an unreachable Kafka
are each one line on stderr and exit 1, with nothing written. It only reads the catalog.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys

from router.config.router import SLOT_NAME, parse_config
from router.errors import ConfigError
from router.postgres.identifiers import quote_ident
from router.postgres.dsn import mask
from router.config.kafka_settings import parse_bootstrap_servers

_ROUTE_NAME = re.compile(r"[^A-Za-z0-9._\-]")
DEFAULT_KAFKA = "127.0.0.1:9092"


class InitError(Exception):
    """One line for the user; nothing was written."""


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: quotes, backslashes and control characters escaped,
    the rest (unicode included) as it is (JSON's escapes would split characters beyond
    U+FFFF into surrogates, which TOML refuses)."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[c])
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04X}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def toml_list(items) -> str:
    return "[" + ", ".join(toml_string(i) for i in items) + "]"


def comment_text(text: str) -> str:
    """``text`` fit for a ``#`` comment: on one line (a newline in a table name or a filter
    literal would end the comment and leave the rest as TOML)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


_SHORT_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


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
                        f"slot needs it (ALTER ROLE {quote_ident(user)} REPLICATION, as a "
                        "superuser)")
    if not pubs:
        tables = ", ".join(map(quote_ident, schemas)) if schemas else "public"
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


def _publishes(pub: dict, table: tuple[str, str]):
    """The entry (schema, table, rowfilter, columns) of ``table`` in ``pub``, or None."""
    return next((t for t in pub["tables"] if (t[0], t[1]) == table), None)


def _covered(pubs: dict, slot: list[str], p: str) -> bool:
    """Every table of ``p`` comes whole from the slot: all rows (no row filter) and all
    columns for each action ``p`` publishes (its route then re-applies its own)."""
    for schema, table, _, _ in pubs[p]["tables"]:
        for action in pubs[p]["actions"]:
            entries = [(_publishes(pubs[q], (schema, table)), q) for q in slot
                       if action in pubs[q]["actions"]]
            if not any(e is not None and e[3] is None and (e[2] is None or action == "truncate")
                       for e, _ in entries):
                return False
    return True


def _clash(pubs: dict, slot: list[str], p: str) -> str | None:
    """A table of ``p`` that a slot publication sends with another column list: PostgreSQL
    refuses to stream it ("cannot use different column lists … in different publications");
    None when there is none."""
    for schema, table, _, cols in pubs[p]["tables"]:
        for q in slot:
            e = _publishes(pubs[q], (schema, table))
            if e is not None and (e[3] if not pubs[q]["all_tables"] else None) != cols:
                return (f"its column list on table {schema}.{table} cannot share the slot with "
                        f"publication {q!r}, which sends that table "
                        + ("with other columns" if e[3] else "whole"))
    return None


def slot_plan(pubs: dict) -> tuple[list[str], dict[str, str]]:
    """What the slot streams, and the publications whose route it cannot feed (with why).

    Publications without column lists all go in (their row filters combine with OR, so each
    route gets at least its rows). A publication with a column list goes in too unless the
    slot already sends its tables whole (its route re-applies the list); PostgreSQL refuses
    one table with two different column lists on one slot, so one that would clash is left
    out, and so is its route: fed from a slot that filters its rows or columns, it would
    miss changes (``pgrouter check`` refuses such a route)."""
    slot = [p for p, d in pubs.items() if all(t[3] is None for t in d["tables"])]
    unfed = {}
    for p in sorted(pubs):
        if p in slot or _covered(pubs, slot, p):
            continue
        why = _clash(pubs, slot, p)
        if why is None:
            slot.append(p)
        else:
            unfed[p] = why
    return sorted(slot), unfed


def slot_publications(pubs: dict) -> list[str]:
    return slot_plan(pubs)[0]


def _route_lines(pub: str, name: str, info: dict, unfed: dict[str, str]) -> list[str]:
    lines = ["", f"# what publication {pub!r} would replicate, one topic per table:",
             *_describe(info["pubs"][pub])]
    route = ["[[routes]]", f"name = {toml_string(name)}", f"publication = {toml_string(pub)}",
             'topic = "{route}.{schema}.{table}"']
    if pub not in unfed:
        return lines + route
    tables = ", ".join(f"{s}.{t}" for s, t, _, _ in info["pubs"][pub]["tables"])
    return lines + [
        f"# NOT ROUTED: {unfed[pub]}. To route it, create a publication for {tables} with",
        "# neither row filter nor column list, add it to [source] publications and uncomment:",
        *(f"# {line}" for line in route)]


def render(info: dict, *, dsn: str, kafka: str | None, slot: str) -> str:
    names: set[str] = set()
    routes = []
    streamed, unfed = slot_plan(info["pubs"])
    for pub in info["pubs"]:
        name = _ROUTE_NAME.sub("_", pub) or "route"
        while name in names:
            name += "_"
        names.add(name)
        routes += _route_lines(pub, name, info, unfed)
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
        f"dsn = {toml_string(dsn)}",
        "# the one logical replication slot every route is fed from (created by the first run)",
        f"slot = {toml_string(slot)}",
        "# what the slot streams: the union of these publications (at least as wide as every",
        "# route; each route re-applies its own publication's filter and columns)",
        f"publications = {toml_list(streamed)}",
        "create_slot = true",
        "",
        "[kafka]",
        "# host:port, comma-separated" + ("" if kafka else " (not checked: give --kafka to check it)"),
        f"bootstrap_servers = {toml_string(kafka or DEFAULT_KAFKA)}",
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
    return "\n".join(comment_text(line) if line.startswith("#") else line
                     for line in lines) + "\n"


def run(args: argparse.Namespace) -> int:
    try:
        if not SLOT_NAME.match(args.slot):
            raise InitError(f"--slot {args.slot!r}: PostgreSQL allows 1-63 lower-case letters, "
                            "digits and underscores in a replication slot name")
        if os.path.exists(args.output) and not args.force:
            raise InitError(f"{args.output} exists: pass --force to overwrite it")
        info = inspect(args.dsn)
        if args.kafka:
            check_kafka(args.kafka)
        text = render(info, dsn=args.dsn, kafka=args.kafka, slot=args.slot)
        try:  # what it writes loads as it is
            parse_config(text, source="the config init would write")
        except ConfigError as exc:
            raise InitError(f"nothing written: {exc}") from None
        with open(args.output, "w") as fh:
            fh.write(text)
    except InitError as exc:
        print(f"pgrouter init: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"pgrouter init: cannot write {args.output}: {exc.strerror}", file=sys.stderr)
        return 1
    unfed = slot_plan(info["pubs"])[1]
    routed = sorted(p for p in info["pubs"] if p not in unfed)
    print(f"wrote {args.output}: slot {args.slot!r}, {len(routed)} route(s), one per publication "
          f"({', '.join(map(repr, routed))}); next: pgrouter check -c {args.output}")
    for pub, why in sorted(unfed.items()):
        print(f"not routed: publication {pub!r}: {why} (the file says how to route it)")
    return 0
