"""The publication definitions a pipeline starts with, and the polling fallback.

Rules:

* Routes that name publications follow them (``services.publication_mode``). Mode ``wal``: the
  event trigger of ``pgrouter setup`` is installed (``source.publication_changes`` "auto" or
  "wal"; with "auto" a superuser router installs it itself); definitions change at their
  position in the stream (``router.routing.definitions``).
  Mode ``poll``: it is not (or "poll" is configured); ``pg_publication*`` is polled and a
  change applies from the router's position when it is noticed, with a warning that
  positions are approximate.
* ``wal`` mode starts, for the slot's confirmed position C, from
  1. the definitions topic's latest state record of this slot whose transaction ended at or
     before C (what the router had in force when it confirmed C);
  2. else, when the trigger's log says the backlog may hold a change (``changes_since``), the
     first definitions message the server would send after C (peeked, nothing consumed: one
     extra decoding of the backlog in the server): its ``before`` (for a baseline message
     from ``pgrouter setup``: its ``after``);
  3. else the definitions now: no DDL that changed them is in the backlog.
  After 2 a state record for C is written at once, so the next start needs no peek (after 3
  the next start finds no change in the log either, which costs one query). The topic is
  created with the first record written (``TOPIC_CONFIGS``: nothing is ever deleted).
  Never the current catalog when the backlog holds a change of it.
"""

from __future__ import annotations

import logging
import time

import msgspec
import trio

from router.config.router import Config
from router.routing.definitions import Definitions, StateRecord, catalog_from_snapshot, \
    parse_message, state_at
from router.postgres.lsn import format_lsn

from router.routing.topics import TopicSpec

from ..kafka.compacted import READ_TIMEOUT, read_topic
from ..services import log
from ..services import publication_trigger as trigger
from ..services.catalog import build_route_specs, load_publications, route_publication_names
from ..services.sql import SqlSession

_log = log.get("definitions")
#: the topic keeps every state record (they are small and rare)
TOPIC_CONFIGS = {"cleanup.policy": "delete", "retention.ms": "-1"}


def read_state_values(cfg: Config, timeout: float = READ_TIMEOUT) -> list[bytes]:
    """Every record value of the definitions topic (blocking; [] when it does not exist),
    read with the configured client's library."""
    k = cfg.kafka
    return [value for _, value in read_topic(k.bootstrap_servers, dict(k.settings),
                                             k.definitions_topic, library=k.client,
                                             timeout=timeout)]


async def starting_definitions(sql: SqlSession, cfg: Config, slot: str, client,
                               confirmed_lsn: int, on_change=None) -> Definitions:
    """``Definitions`` in force at ``confirmed_lsn`` for ``slot`` (see the module rules)."""
    topic = cfg.kafka.definitions_topic
    t0 = time.monotonic()
    values = await trio.to_thread.run_sync(read_state_values, cfg)
    record = state_at(values, slot, confirmed_lsn)
    if record is not None:
        snapshot, origin = msgspec.json.decode(record.snapshot), "state record"
    else:
        content = None
        if await trigger.changes_since(sql, slot):
            now = await sql.fetchval("select pg_current_wal_lsn()::text")
            content = await trigger.first_message(sql, slot, cfg.source.publications, now)
        if content is not None:
            msg = parse_message(_message_content(content))
            snapshot = msg.before if msg.before is not None else msg.after
            origin = f"first definitions message ({msg.event})"
            # spare the next start this peek: the state at C, written before streaming
            state = StateRecord(slot=slot, commit_lsn=confirmed_lsn,
                                end_lsn=confirmed_lsn, lsn=confirmed_lsn,
                                snapshot=msgspec.Raw(msgspec.json.encode(snapshot)))
            if cfg.kafka.create_topics:
                await trio.to_thread.run_sync(client.ensure_topics, [
                    TopicSpec(topic, 1, 1, TOPIC_CONFIGS)])
            await trio.to_thread.run_sync(client.produce_sync, topic, slot.encode(),
                                          msgspec.json.encode(state))
        else:
            snapshot, origin = msgspec.json.decode(await trigger.snapshot_text(sql)), "catalog"
    log.event(_log, "publication definitions at the slot's position", mode="wal",
              source=origin, confirmed_lsn=format_lsn(confirmed_lsn),
              seconds=round(time.monotonic() - t0, 3))
    return Definitions(catalog_from_snapshot(snapshot), lambda c: build_route_specs(cfg, c),
                       slot=slot, topic=topic,
                       route_publications=route_publication_names(cfg), on_change=on_change)


async def for_pipeline(mode_: str | None, cfg: Config, slot: str, client,
                       confirmed_lsn: int) -> Definitions | None:
    """The definitions a pipeline's routers follow in ``wal`` mode, else None; ``slot``:
    the start's ``Source.slot``."""
    if mode_ != "wal":
        return None
    async with await SqlSession.connect(cfg.source.dsn) as sql:
        return await starting_definitions(sql, cfg, slot, client, confirmed_lsn,
                                          on_change=log_change)


def _message_content(data: bytes) -> bytes:
    """The content of a pgoutput Message ('M', flags, lsn, prefix NUL, length, content)."""
    end = data.index(b"\x00", 10)
    length = int.from_bytes(data[end + 1:end + 5], "big")
    return data[end + 5:end + 5 + length]


def log_change(msg, catalog) -> None:
    log.event(_log, "publication definitions changed", tag=msg.tag, event=msg.event,
              publications=len(catalog.publications))


class PublicationPoller:
    """``poll`` mode: reads the route publications every ``publication_poll_interval``
    seconds and calls ``reload()`` when they differ from the last reading (the first one:
    ``catalog``, what the pipeline started with)."""

    def __init__(self, cfg: Config, reload, catalog=None):
        self.cfg, self.reload = cfg, reload
        self.interval = cfg.source.publication_poll_interval
        names = route_publication_names(cfg)
        self._last = None if catalog is None else {
            n: p for n, p in catalog.publications.items() if n in names}

    async def read(self):
        async with await SqlSession.connect(self.cfg.source.dsn) as sql:
            return await load_publications(sql, route_publication_names(self.cfg))

    async def run(self) -> None:
        if self._last is None:
            self._last = await self.read()
        while True:
            await trio.sleep(self.interval)
            try:
                now = await self.read()
            except Exception as exc:  # a failed poll is retried at the next interval
                log.event(_log, "publication poll failed", error=str(exc))
                continue
            if now != self._last:
                changed = sorted(n for n in set(now) | set(self._last)
                                 if now.get(n) != self._last.get(n))
                log.event(_log, "publication changed: applying from the current position; "
                          "positions are approximate (run 'pgrouter setup' for changes at "
                          "their WAL position)", level=logging.WARNING, publications=changed)
                self._last = now
                await self.reload()
