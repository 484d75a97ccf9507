"""``pgrouter snapshot -c FILE --route R [--table T …]``: ask the router running on the
config's slot to backfill tables into some routes' topics, while it keeps streaming.

The request is a transactional logical decoding message (``router.snapshot``) written into
the source's WAL: the router reads it from its slot in commit order, records it in the
progress topic and runs it (``actors.snapshot.backfill``); a router that is not running
picks it up when it starts. Routes and tables are checked first: a slot that does not exist
yet (no router would ever read the request), a table without a usable key, not streamed by
the slot or not taken by the route is refused with one line per problem, and nothing is
requested.
"""

from __future__ import annotations

import argparse
import sys
import uuid

import trio
import trio_asyncio

from router.errors import ConfigError
from router.snapshot import PREFIX, Watermark, encode_watermark

from ..services.catalog import load_catalog
from ..services.sql import SqlSession
from ..snapshot.initial import type_names
from ..snapshot.jobs import plan_jobs
from .config_file import load


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", required=True, help="TOML config file")
    p.add_argument("--route", action="append", required=True, metavar="R",
                   help="route whose topics get the rows (repeatable)")
    p.add_argument("--table", action="append", default=[], metavar="T",
                   help="schema.table to backfill (repeatable; default: every table the "
                        "routes take)")


async def request(cfg, routes: list[str], tables: list[str]) -> tuple[str, list, list[str]]:
    async with trio_asyncio.open_loop():
        async with await SqlSession.connect(cfg.source.dsn) as sql:
            if not await sql.fetchval("select count(*) from pg_replication_slots "
                                      "where slot_name = $1", cfg.source.slot):
                # the request is a message in the WAL: before the slot exists, no router
                # would ever read it
                return "", [], [f"replication slot {cfg.source.slot!r} does not exist yet: "
                                "start the router once (pgrouter run) before requesting a "
                                "backfill; its initial snapshot follows [snapshot] mode"]
            catalog = await load_catalog(sql, cfg)
            db = await sql.fetchval("select current_database()")
            rid = uuid.uuid4().hex
            jobs, problems = await plan_jobs(sql, cfg, catalog, db, rid, routes, tables,
                                             type_names)
            if problems or not jobs:
                return rid, jobs, problems or ["nothing to backfill: the routes take no table "
                                               "the slot streams"]
            mark = Watermark("request", cfg.source.slot, chunk=rid, routes=tuple(routes),
                             tables=tuple(tables))
            await sql.execute("select pg_logical_emit_message(true, $1, $2::text)", PREFIX,
                              encode_watermark(mark).decode())
            return rid, jobs, []


def run(args: argparse.Namespace) -> int:
    cfg = load(args.config, "snapshot")
    if not cfg.source.messages:
        raise ConfigError("backfills need logical messages (the watermarks)",
                          path="source.messages")
    rid, jobs, problems = trio.run(request, cfg, args.route, args.table)
    if problems:
        for p in problems:
            print(f"pgrouter snapshot: {p}", file=sys.stderr)
        return 1
    for job in jobs:
        print(f"backfill requested: request={rid} route={job.route} table={job.name} "
              f"key={','.join(job.key)}")
    return 0
