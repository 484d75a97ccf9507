"""``pgrouter setup -c FILE``: install what routes need in the source database.

Installs the event trigger that writes publication definitions into the WAL
(``actors.services.publication_trigger``; needs a superuser on PostgreSQL 15), creates the
slot when it is missing and ``source.create_slot`` is true, and emits a baseline
definitions message. ``--uninstall`` removes the trigger and its schema (routes then fall
back to polling). Idempotent.
"""

from __future__ import annotations

import argparse

import asyncpg
import trio
import trio_asyncio

from router.errors import ConfigError, SourceError
from router.snapshot.signals import SETUP_SQL as SIGNALS_SQL

from ..runner.source import Source
from ..services import publication_trigger as trigger, slots
from ..services.retry import primary
from ..services.sql import SqlSession
from .config_file import load


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", required=True, help="TOML config file")
    p.add_argument("--uninstall", action="store_true",
                   help="remove the event trigger and the pgrouter schema")


async def _setup(cfg, uninstall: bool) -> list[str]:
    async with trio_asyncio.open_loop():
        try:
            return await _statements(cfg, uninstall)
        except asyncpg.PostgresError as exc:
            raise SourceError(f"setup failed in PostgreSQL: {exc}") from exc


async def _statements(cfg, uninstall: bool) -> list[str]:
    src = cfg.source
    done = []
    async with await SqlSession.connect(src.dsn) as sql:
        if uninstall:
            for stmt in trigger.uninstall_sql():
                await sql.execute(stmt)
            return ["event trigger removed"]
        if not await trigger.superuser(sql):
            raise ConfigError("installing the event trigger needs a superuser (PostgreSQL "
                              "allows event triggers to superusers only)", path="source.dsn")
        await trigger.install(sql)
        done.append(f"event trigger installed ({', '.join(trigger.TRIGGERS)})")
        for stmt in SIGNALS_SQL:
            await sql.execute(stmt)
        done.append("signal table pgrouter.signals ready (an insert asks for a backfill)")
        slot = Source(src).slot
        if src.create_slot and not await slots.exists(sql, slot):
            await slots.create(sql, slot, src.two_phase)
            done.append(f"replication slot {slot} created")
        lsn = await trigger.emit_baseline(sql)
        done.append(f"baseline definitions message at {lsn}")
    return done


def run(args: argparse.Namespace) -> int:
    cfg = load(args.config, "setup")
    try:
        done = trio.run(_setup, cfg, args.uninstall)
    except BaseExceptionGroup as group:  # trio-asyncio's loop wraps what escapes it
        raise primary(group) from None
    for line in done:
        print(line)
    return 0
