"""``pgrouter verify``: for each route, its topics folded at one position against the rows the
route would hold at that position.

Rules:

* The source side is the router's own initial copy (``actors.snapshot.tables``,
  ``router.snapshot.rows``): the rows of every table the slot streams and the route takes,
  read by ``COPY`` on the verify snapshot (``actors.verify.point``) with the slot's
  publications' filter in its ``WHERE``, then through the route's plan — its row filter (the
  OR of its publications' filters, none when one has none), its column list,
  ``publish_via_partition_root`` (a partition's rows are compared with the root's topic) — and
  encoded by the sink's record format. Both sides are then decoded by one ``Decoder``, so
  values compare in one representation, whatever the format (JSON, Connect, Avro).
* The topic side: every record up to the end offsets once the router delivered past the
  point, folded by ``router.verify.fold.TopicFold`` at the point.
* Topics of keyed tables (JSON format; Connect and Avro when every column's type renders
  alike, ``actors.verify.digests.digestible``) are compared by bucket digests first
  (``actors.verify.digests``, ``router.verify.digests``), the source's computed while the
  topic is read: only the rows of buckets that differ are read and compared one by one.
  Other topics have every row read.
* Metrics (``actors.verify.metrics``): each topic's result as it is known, the records read.
* The route's actions decide what counts as a difference (``router.verify.fold.Comparer``).
* Tables without a primary key or replica identity index: with REPLICA IDENTITY FULL their
  rows are compared as multisets (the topic keys them by the whole row, which repeats);
  without it (no key at all) they cannot be told apart: one line, and they are left out
  (``--table`` naming one is an error).
* Routes, tables and the slot are checked before the snapshot is taken: one line each.
  Kafka is asked while it is taken (its failure said first, the snapshot let go).
* Memory: the fold of one topic at a time (a digest of 8 bytes per column and key), in
  passes of at most ``max_keys`` keys (``actors.verify.compare``).
"""

from __future__ import annotations

import os
import time
import uuid

import trio
import trio_asyncio

from router.config.router import Config, qualified
from router.errors import ConfigError, SlotMissing
from router.postgres.identifiers import unparse_qualified
from router.config.kafka_settings import LIBRDKAFKA
from router.routing.change_router import ChangeRouter
from router.snapshot.rows import SnapshotRows
from router.verify.fold import Comparison

from ..services.catalog import load_catalog, load_primary_keys
from ..services import slots
from ..services.preflight import KAFKA_TIMEOUT, kafka_admin
from ..services.sql import SqlSession
from ..snapshot.column_types import type_names
from ..snapshot.reader import TableReader
from ..snapshot.tables import SnapshotTable, slot_tables, snapshot_specs
from .compare import SPLIT_ROWS, compare_target
from .digests import route_filter
from .point import VerifyPoint, wait_delivered
from .topic import kafka_answers


#: keys of one topic folded at a time by default (``--max-keys``): about 450 bytes each
MAX_KEYS = 2_000_000


class Target:
    """One route's tables to read and topics to fold."""

    def __init__(self, route: str, actions: frozenset[str], rows: SnapshotRows,
                 tables: list[SnapshotTable], multiset: set[tuple[str, str]],
                 filters: dict[str, str | None]):
        self.route, self.actions, self.rows, self.tables = route, actions, rows, tables
        self.filters = filters  # table -> the route's own row filter (SQL), for digests
        self.multiset = multiset  # tables (as published) compared as multisets
        self.topics: dict[str, list[SnapshotTable]] = {}  # topic -> tables feeding it
        for t in tables:
            for plan in rows.router.plans_for(t.relation):
                self.topics.setdefault(plan.topic, []).append(t)

    def keyless(self, topic: str) -> bool:
        return all((t.relation.namespace, t.relation.name) in self.multiset
                   for t in self.topics[topic])


def route_actions(cfg: Config, catalog, route) -> frozenset[str]:
    if route.publication_names():
        return frozenset().union(*(catalog.publications[p].actions()
                                   for p in route.publication_names()))
    return frozenset(route.operations)


async def plan(sql: SqlSession, cfg: Config, slot: str, routes: list[str],
               tables: list[str], warn) -> list[Target]:
    """The routes' targets of the router streaming ``slot``; bad input raises
    ``ConfigError`` naming it."""
    known = {r.name: r for r in cfg.routes}
    for name in routes:
        if name not in known:
            raise ConfigError(f"--route {name}: no such route (the config has "
                              f"{', '.join(sorted(known)) or 'none'})")
    if not await slots.exists(sql, slot):
        raise SlotMissing(f"source.slot: replication slot {slot!r} does not exist: "
                          "verify compares what the router delivered (start it first)")
    catalog = await load_catalog(sql, cfg)
    only = {qualified(t) for t in tables} or None
    for t in only or ():
        if t not in catalog.tables:
            raise ConfigError(f"--table {unparse_qualified(*t)}: no such table in the source")
    db = await sql.fetchval("select current_database()")
    leaves = slot_tables(cfg, catalog, only)
    names = await type_names(sql, leaves)
    pks = await load_primary_keys(sql)
    out = []
    for r in cfg.routes:
        if routes and r.name not in routes:
            continue
        rows = SnapshotRows(ChangeRouter(snapshot_specs(cfg, catalog, {r.name}), db=db,
                                         type_names=names, primary_keys=pks))
        taken, multiset = [], set()
        for t in leaves:
            if not rows.routed(t.relation):
                continue
            published = (t.relation.namespace, t.relation.name)
            if not pks.get(published) and t.relation.replica_identity != "i":
                if t.relation.replica_identity != "f":
                    line = (f"table {t.name} has no primary key, no replica identity index and "
                            "not REPLICA IDENTITY FULL: its rows cannot be told apart in the "
                            "topic")
                    if only:
                        raise ConfigError(f"--table {t.name}: {line[len(t.name) + 7:]}")
                    warn(f"{line}; left out of route {r.name}")
                    continue
                multiset.add(published)
            taken.append(t)
        if taken:
            out.append(Target(r.name, route_actions(cfg, catalog, r), rows, taken, multiset,
                              {t.name: route_filter(cfg, catalog, r.name, t) for t in taken}))
    for t in only or ():
        if not any(t in (x.table, (x.relation.namespace, x.relation.name))
                   or t in catalog.tables[x.table].ancestors
                   for target in out for x in target.tables):
            raise ConfigError(f"--table {unparse_qualified(*t)}: no route verified takes it (or the "
                              "slot's publications do not stream it)")
    return out


class ProgressLine:
    """A progress line on stderr every ``interval`` seconds."""

    def __init__(self, interval: float, out):
        self.interval, self.out, self.last = interval, out, time.monotonic()

    def __call__(self, what: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.interval:
            self.last = now
            print(f"pgrouter verify: {what}", file=self.out, flush=True)


async def verify(cfg: Config, slot: str, routes: list[str], tables: list[str], *,
                 wait: float, examples: int, progress: ProgressLine, warn,
                 repairs: list | None = None,
                 max_keys: int = MAX_KEYS, split_rows: int = SPLIT_ROWS,
                 metrics=None) -> list[Comparison]:
    """The comparisons of what the router streaming ``slot`` delivered; with ``repairs`` (a
    list), what each differing topic needs is appended to it
    (``actors.verify.repair.Repair``); ``metrics`` (``actors.verify.metrics.VerifyMetrics``)
    learns each result and the records read."""
    async with trio_asyncio.open_loop():
        async with await SqlSession.connect(cfg.source.dsn) as sql:
            targets = await plan(sql, cfg, slot, routes, tables, warn)
            point, reader = await _prepared(cfg, targets)
            try:
                progress(f"snapshot at {point.lsn:X}; waiting for the router to deliver "
                         "up to it", force=True)
                await wait_delivered(sql, slot, point.lsn, wait)
                results = []
                for target in targets:
                    results.extend(await compare_target(cfg, target, reader, point.lsn,
                                                        examples, progress, repairs, max_keys,
                                                        split_rows, metrics))
                return results
            finally:
                await reader.close()


async def _prepared(cfg: Config, targets: list[Target]) -> tuple[VerifyPoint, TableReader]:
    """Kafka asked (``_kafka_answers``), the verify point taken and the reader connected at
    once, each a few round trips away; then the reader imports the point's snapshot and
    the point's connection is closed (its temporary slot dropped). A failure is raised as
    it is, Kafka's first, after what did open is closed."""
    name = f"pgrouter_verify_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    ok: dict = {}
    failed: dict = {}

    async def run(what: str, call, *args) -> None:
        try:
            ok[what] = await call(*args)
        except Exception as exc:  # noqa: BLE001 — raised below, in order
            failed[what] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "kafka", trio.to_thread.run_sync, _kafka_answers, cfg, targets)
        nursery.start_soon(run, "point", trio.to_thread.run_sync, VerifyPoint, cfg.source.dsn,
                           name)
        nursery.start_soon(run, "reader", TableReader.open, cfg.source.dsn)
    try:
        for what in ("kafka", "point", "reader"):
            if what in failed:
                raise failed[what]
        await ok["reader"].import_snapshot(ok["point"].snapshot)
    except BaseException:
        if "reader" in ok:
            await ok["reader"].close()
        raise
    finally:
        if "point" in ok:
            await trio.to_thread.run_sync(ok["point"].close)  # drops the temporary slot
    return ok["point"], ok["reader"]


def _kafka_answers(cfg: Config, targets: list[Target]) -> None:
    """Kafka answers (``SinkUnavailable`` in one line otherwise), asked while the snapshot
    is taken (``_prepared``)."""
    if cfg.kafka.client == LIBRDKAFKA:  # the client that reads the topics
        kafka_answers(cfg.kafka.bootstrap_servers, dict(cfg.kafka.settings),
                      [topic for t in targets for topic in t.topics], KAFKA_TIMEOUT)
    else:
        kafka_admin(cfg).close()
