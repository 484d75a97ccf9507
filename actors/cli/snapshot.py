"""``pgrouter snapshot -c FILE --route R [--table T …]``: ask the router running on the
config's slot to backfill tables into some routes' topics, while it keeps streaming.

The request is a transactional logical decoding message (``router.snapshot.core``) written into
the source's WAL: the router reads it from its slot in commit order, records it in the
state topic and runs it (``actors.snapshot.backfill``); a router that is not running
picks it up when it starts. Routes and tables are checked first: a slot that does not exist
yet (no router would ever read the request), a table without a usable key, not streamed by
the slot or not taken by the route is refused with one line per problem, and nothing is
requested.
"""

from __future__ import annotations

import argparse
import sys

import trio

from router.errors import ConfigError

from ..runner.source import Source
from ..snapshot.request import request
from .config_file import load


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", required=True, help="TOML config file")
    p.add_argument("--route", action="append", required=True, metavar="R",
                   help="route whose topics get the rows (repeatable)")
    p.add_argument("--table", action="append", default=[], metavar="T",
                   help="schema.table to backfill (repeatable; default: every table the "
                        "routes take)")


def run(args: argparse.Namespace) -> int:
    cfg = load(args.config, "snapshot")
    if not cfg.source.messages:
        raise ConfigError("backfills need logical messages (the watermarks)",
                          path="source.messages")
    rid, jobs, problems = trio.run(request, cfg, Source(cfg.source).slot, args.route,
                                      args.table)
    if problems:
        for p in problems:
            print(f"pgrouter snapshot: {p}", file=sys.stderr)
        return 1
    for job in jobs:
        print(f"backfill requested: request={rid} route={job.route} table={job.name} "
              f"key={','.join(job.key)}")
    return 0
