"""``pgrouter verify``: for each route, its topics folded at one position against the rows the
route would hold at that position.

Rules:

* The source side is the router's own initial copy (``actors.snapshot.tables``,
  ``router.snapshot_rows``): the rows of every table the slot streams and the route takes,
  read by ``COPY`` on the verify snapshot (``actors.verify.point``) with the slot's
  publications' filter in its ``WHERE``, then through the route's plan — its row filter (the
  OR of its publications' filters, none when one has none), its column list,
  ``publish_via_partition_root`` (a partition's rows are compared with the root's topic) — and
  encoded by the sink's record format. Both sides are then decoded by one ``Decoder``, so
  values compare in one representation, whatever the format (JSON, Connect, Avro).
* The topic side: every record up to the end offsets once the router delivered past the
  point, folded by ``router.verify.TopicFold`` at the point.
* JSON-format topics of keyed tables are compared by bucket digests first
  (``actors.verify.digests``, ``router.verify_digest``), PostgreSQL's computed while the topic
  is read: only the rows of buckets that differ are read and compared one by one. Other
  topics have every row read.
* The route's actions decide what counts as a difference (``router.verify.Comparer``).
* Tables without a primary key or replica identity index: with REPLICA IDENTITY FULL their
  rows are compared as multisets (the topic keys them by the whole row, which repeats);
  without it (no key at all) they cannot be told apart: one line, and they are left out
  (``--table`` naming one is an error).
* Routes, tables and the slot are checked before the snapshot is taken: one line each.
* Memory: the fold of one topic at a time (a digest of 8 bytes per column and key).
"""

from __future__ import annotations

import os
import time
import uuid

import trio
import trio_asyncio

from router.avro import SchemasNeeded
from router.config import Config, qualified
from router.errors import ConfigError, SlotMissing
from router.routing import ChangeRouter
from router.snapshot_rows import SnapshotRows
from router.verify import Comparer, Comparison, TopicFold, salted
from router.verify_digest import bucket_sums, buckets_for, row_columns
from router.envelope import TxContext

from ..pipeline.formats import record_reshaper
from ..services.catalog import load_catalog, load_primary_keys
from ..services.preflight import kafka_admin
from ..services.sql import SqlSession
from ..snapshot.initial import type_names
from ..snapshot.reader import TableReader
from ..snapshot.tables import SnapshotTable, ident, slot_tables, snapshot_specs
from .digests import differing, route_filter, rows_select, sql_sums
from .point import VerifyPoint, wait_delivered
from .repair import Repair
from .topic import Decoder, fold_topic


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


async def plan(sql: SqlSession, cfg: Config, routes: list[str], tables: list[str],
               warn) -> list[Target]:
    """The routes' targets; bad input raises ``ConfigError`` naming it."""
    known = {r.name: r for r in cfg.routes}
    for name in routes:
        if name not in known:
            raise ConfigError(f"--route {name}: no such route (the config has "
                              f"{', '.join(sorted(known)) or 'none'})")
    if not await sql.fetchval("select count(*) from pg_replication_slots where slot_name = $1",
                              cfg.source.slot):
        raise SlotMissing(f"source.slot: replication slot {cfg.source.slot!r} does not exist: "
                          "verify compares what the router delivered (start it first)")
    catalog = await load_catalog(sql, cfg)
    only = {qualified(t) for t in tables} or None
    for t in only or ():
        if t not in catalog.tables:
            raise ConfigError(f"--table {t[0]}.{t[1]}: no such table in the source")
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
            raise ConfigError(f"--table {t[0]}.{t[1]}: no route verified takes it (or the "
                              "slot's publications do not stream it)")
    return out


class Progress:
    """A progress line on stderr every ``interval`` seconds."""

    def __init__(self, interval: float, out):
        self.interval, self.out, self.last = interval, out, time.monotonic()

    def __call__(self, what: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.interval:
            self.last = now
            print(f"pgrouter verify: {what}", file=self.out, flush=True)


async def verify(cfg: Config, routes: list[str], tables: list[str], *, wait: float,
                 examples: int, progress: Progress, warn,
                 repairs: list | None = None) -> list[Comparison]:
    """The comparisons; with ``repairs`` (a list), what each differing topic needs is
    appended to it (``actors.verify.repair.Repair``)."""
    async with trio_asyncio.open_loop():
        async with await SqlSession.connect(cfg.source.dsn) as sql:
            targets = await plan(sql, cfg, routes, tables, warn)
            await trio.to_thread.run_sync(_kafka_answers, cfg)
            name = f"pgrouter_verify_{os.getpid()}_{uuid.uuid4().hex[:8]}"
            point = await trio.to_thread.run_sync(VerifyPoint, cfg.source.dsn, name)
            reader = None
            try:
                reader = await TableReader.open(cfg.source.dsn)
                await reader.import_snapshot(point.snapshot)
            finally:
                await trio.to_thread.run_sync(point.close)  # drops the temporary slot
            try:
                progress(f"snapshot at {point.lsn:X}; waiting for the router to deliver "
                         "up to it", force=True)
                await wait_delivered(sql, cfg.source.slot, point.lsn, wait)
                results = []
                for target in targets:
                    results.extend(await _compare(cfg, target, reader, point.lsn, examples,
                                                  progress, repairs))
                return results
            finally:
                await reader.close()


def _kafka_answers(cfg: Config) -> None:
    """Kafka answers (``SinkUnavailable`` in one line otherwise), before the snapshot."""
    kafka_admin(cfg).close()


async def _compare(cfg: Config, target: Target, reader: TableReader, cut: int,
                   examples: int, progress: Progress, repairs: list | None
                   ) -> list[Comparison]:
    decoder = Decoder(cfg.kafka.registry)
    reshape = record_reshaper(cfg)
    tx = TxContext(xid=0, commit_lsn=cut - 1, end_lsn=cut, commit_time=0)
    out = []
    for topic, tables in target.topics.items():
        started = time.monotonic()
        schemas = {t.name: next(p.encoder.schema for p in target.rows.router.plans_for(
            t.relation) if p.topic == topic) for t in tables}
        by_buckets = cfg.kafka.format == "json" and not target.keyless(topic) and all(
            set(s.key_columns) <= {c.name for c in s.columns} and s.key_columns
            for s in schemas.values())
        fold = TopicFold(cut, row_columns if by_buckets else salted)

        def report(n, topic=topic):
            progress(f"route {target.route}: topic {topic}: {n} records read")

        async def read_topic(fold=fold, topic=topic, report=report):
            await trio.to_thread.run_sync(lambda: fold_topic(
                cfg.kafka.bootstrap_servers, dict(cfg.kafka.settings), topic, fold, decoder,
                report, target.keyless(topic), library=cfg.kafka.client))

        source: dict[int, list] = {}
        buckets = 0
        async with trio.open_nursery() as both:  # PostgreSQL digests while the topic is read
            both.start_soon(read_topic)
            if by_buckets:
                buckets = buckets_for(await _rows(reader, tables))
                for t in tables:
                    await sql_sums(reader.sql, t, schemas[t.name], target.filters[t.name],
                                   buckets, source)
        names = sorted({t.name for t in tables})
        comparer = Comparer(Comparison(target.route, topic, names), fold, target.actions,
                            examples, repairs is not None)
        narrowed = None
        if by_buckets:
            narrowed = buckets, narrow(comparer, buckets, source)
        counted = [0]
        for table in tables:
            multiset = (table.relation.namespace, table.relation.name) in target.multiset

            async def deliver(batch, table=table, multiset=multiset):
                chunk = target.rows.chunk(table.relation, batch, tx, 0)
                for _topic, key, value, _headers in await _encoded(reshape, chunk):
                    env = decoder.value(value)
                    if env is not None:
                        comparer.row(None if multiset else decoder.key(key),
                                     env.get("after") or {})
                counted[0] += len(batch)
                progress(f"route {target.route}: topic {topic}: {counted[0]} source rows "
                         "compared")

            if narrowed is None:
                await reader.copy(table.select(), deliver, f"reading {table.name}")
            elif narrowed[1]:
                where = target.filters[table.name]
                await reader.copy(rows_select(table, schemas[table.name], where, narrowed[0]),
                                  deliver, f"reading {table.name}", (sorted(narrowed[1]),))
        result = comparer.finish()
        result.seconds = round(time.monotonic() - started, 3)
        out.append(result)
        if repairs is not None and not result.ok:
            repairs.append(Repair(target.route, topic, tables, target.keyless(topic),
                                  comparer.send, comparer.delete))
    return out


async def _rows(reader: TableReader, tables) -> int:
    """About how many rows the tables hold (the planner's estimate, else a count)."""
    n = sum([await reader.estimate(t.table) for t in tables])
    if n > 0:
        return n
    for t in tables:
        n += await reader.sql.fetchval(f"SELECT count(*) FROM ONLY {ident(t.table[0])}."
                                       f"{ident(t.table[1])}")
    return n


def narrow(comparer: Comparer, buckets: int, source: dict[int, list]) -> set[int]:
    """The tables' bucket digests (``source``, computed by PostgreSQL) against the folded
    topic's: the rows of equal buckets count as matching and leave the comparison; returns
    the buckets that differ (whose rows are read and compared one by one)."""
    sums, where = bucket_sums(comparer.topic, buckets)
    differ = differing(source, sums)
    comparer.result.buckets, comparer.result.buckets_differing = buckets, len(differ)
    comparer.skip_equal(sum(n for b, (n, _h) in source.items() if b not in differ),
                        lambda k: where[k] in differ)
    return differ


async def _encoded(reshape, chunk) -> list:
    """The chunk's records as the sink writes them (Avro: schemas registered, as the sink
    does; the registry hands back the ids the router's records carry)."""
    if reshape is None:
        return chunk.records
    while True:
        try:
            return reshape(chunk)
        except SchemasNeeded as need:
            await trio.to_thread.run_sync(reshape.register, need.subjects)
