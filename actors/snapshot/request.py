"""A backfill request (``pgrouter snapshot`` and the console's backfill button): checked
against the catalog, then written into the source's WAL as a transactional logical decoding
message (``router.snapshot.core``) that the router reads from its slot in commit order.

Runs its own trio loop and SQL session (``trio.run(request, …)``), so it may be called from
any thread that is not a trio loop's: the CLI's, or one of the console's request threads.
"""

from __future__ import annotations

import uuid

import trio_asyncio

from router.snapshot.core import PREFIX, Watermark, encode_watermark

from ..services import slots
from ..services.catalog import load_catalog
from ..services.sql import SqlSession
from .column_types import type_names
from .jobs import plan_jobs


async def request(cfg, slot: str, routes: list[str],
                  tables: list[str]) -> tuple[str, list, list[str]]:
    """A backfill of ``routes``/``tables`` asked of the router streaming ``slot``."""
    async with trio_asyncio.open_loop():
        async with await SqlSession.connect(cfg.source.dsn) as sql:
            if not await slots.exists(sql, slot):
                # the request is a message in the WAL: before the slot exists, no router
                # would ever read it
                return "", [], [f"replication slot {slot!r} does not exist yet: "
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
            mark = Watermark("request", slot, chunk=rid, routes=tuple(routes),
                             tables=tuple(tables))
            await sql.execute("select pg_logical_emit_message(true, $1, $2::text)", PREFIX,
                              encode_watermark(mark).decode())
            return rid, jobs, []
