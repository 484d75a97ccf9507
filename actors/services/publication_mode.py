"""Which way routes that follow a publication learn of its changes: ``wal`` (the event
trigger of ``pgrouter setup`` puts them into the WAL, ``router.routing.definitions``) or ``poll``
(``pg_publication*`` is polled), and the warnings that go with each.

Rules:

* Routes that name publications follow them (``follows_publications``). ``wal`` when the
  trigger is installed (``source.publication_changes`` "auto" or "wal"; with "auto" a
  superuser router installs it itself); ``poll`` when it is not, or "poll" is configured;
  "wal" without the trigger is refused.
* A route publication whose catalog rows are newer than the slot's ``catalog_xmin`` may have
  changed inside the backlog where no trigger recorded the position: said once at start.
* Without the TRUNCATE markers a partitioned table's own TRUNCATE cannot be told from its
  partitions' (``router.routing.truncates``): said once at start for publications that publish
  TRUNCATE via the root.
"""

from __future__ import annotations

import logging

import asyncpg

from router.config.router import Config
from router.errors import ConfigError

from . import log
from . import publication_trigger as trigger, slots
from .catalog import route_publication_names
from .sql import SqlSession

_log = log.get("definitions")


def follows_publications(cfg: Config) -> bool:
    return any(r.publication_names() for r in cfg.routes)


async def warn_unplaced(sql: SqlSession, cfg: Config, slot: str, why: str) -> None:
    """Say so when a route publication may have changed inside the slot's backlog while no
    trigger recorded where: the current definition then applies to all of the backlog."""
    names = await slots.changed_in_backlog(sql, slot, route_publication_names(cfg))
    if names:
        log.event(_log, f"publication(s) changed inside the slot's backlog with {why}: the "
                  "current definitions apply to all of it, positions of those changes are "
                  "unknown", level=logging.WARNING,
                  publications=",".join(r["pubname"] for r in names))


async def warn_unmarked(sql: SqlSession, cfg: Config) -> None:
    """Without the TRUNCATE markers of ``pgrouter setup`` a partitioned table's own TRUNCATE
    cannot be told from its partitions' (``router.routing.truncates``): say so when a route
    publication publishes TRUNCATE via the root."""
    names = await sql.fetch("select pubname from pg_publication where pubname = any($1::text[])"
                            " and pubviaroot and pubtruncate order by 1",
                            route_publication_names(cfg))
    if names:
        log.event(_log, "TRUNCATE of partitioned tables these publications publish via their "
                  "root is not sent without the markers of 'pgrouter setup' (a partition's "
                  "own TRUNCATE, which PostgreSQL does not send, looks the same in the slot)",
                  level=logging.WARNING, publications=",".join(r["pubname"] for r in names))


async def mode(sql: SqlSession, cfg: Config, slot: str, *,
               install: bool = True) -> str | None:
    """"wal", "poll", or None when no route follows a publication (of ``slot``'s backlog). Without ``install`` a
    superuser's "auto" says "wal" without installing anything."""
    if not follows_publications(cfg):
        return None
    wanted = cfg.source.publication_changes
    if wanted == "poll":
        if install:
            await warn_unplaced(sql, cfg, slot, "publication changes polled")
            if not await trigger.installed(sql):
                await warn_unmarked(sql, cfg)
        return "poll"
    if await trigger.installed(sql):
        return "wal"
    if wanted == "auto" and await trigger.superuser(sql):
        if not install:
            return "wal"
        try:
            await trigger.install(sql)
        except asyncpg.PostgresError as exc:  # e.g. another router installing it right now
            log.event(_log, "could not install the event trigger", error=str(exc),
                      level=logging.WARNING)
        if await trigger.installed(sql):
            log.event(_log, "event trigger installed: publication changes apply at their "
                      "WAL position", triggers=",".join(trigger.TRIGGERS))
            await warn_unplaced(sql, cfg, slot, "no event trigger installed yet")
            return "wal"
    if install:
        await warn_unplaced(sql, cfg, slot, "publication changes polled")
        await warn_unmarked(sql, cfg)
    if wanted == "wal":
        raise ConfigError("publication changes at WAL positions need the event trigger: run "
                          "'pgrouter setup -c FILE' as a superuser",
                          path="source.publication_changes")
    return "poll"
