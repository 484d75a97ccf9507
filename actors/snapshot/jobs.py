"""Backfill jobs: what a request (``pgrouter snapshot``, or an interrupted initial snapshot)
asks for, checked against the catalog — one job per (route, table).

Rules:

* A route's tables are those it takes among the tables the slot streams
  (``actors.snapshot.tables.slot_tables``); ``--table`` names narrow them (a partitioned table
  names its leaves).
* Finishing an interrupted initial snapshot, a job leaves out the block ranges of its table
  the snapshot recorded done (``done_ranges``).
* Chunks go by the table's key: the replica identity (the primary key, or the index of
  REPLICA IDENTITY USING INDEX), or the primary key of a REPLICA IDENTITY FULL table — the
  columns the stream's changes are keyed by, so a change inside a window names the chunk
  row it replaces. A table without one cannot be backfilled by chunks: a request is refused
  for it (one clear line); only the resumption of an initial snapshot copies such a table
  whole between two watermarks.
"""

from __future__ import annotations

import msgspec

from router.config.router import Config, qualified
from router.errors import ConfigError
from router.routing.change_router import ChangeRouter
from router.snapshot.signals import where_problem
from router.snapshot.ranges import done_blocks
from router.snapshot.rows import SnapshotRows

from ..services import log
from ..services.catalog import build_route_specs
from ..services.sql import SqlSession
from .tables import SnapshotTable, ident, slot_tables, snapshot_specs

_log = log.get("snapshot")

_PRIMARY_KEY = """
select array_agg(a.attname::text order by array_position(i.indkey::int2[], a.attnum))
from pg_index i join pg_attribute a on a.attrelid = i.indrelid and a.attnum = any(i.indkey::int2[])
where i.indrelid = to_regclass($1) and i.indisprimary
"""

_TYPES = """
select a.attname::text as name, format_type(a.atttypid, a.atttypmod) as type
from pg_attribute a where a.attrelid = to_regclass($1) and a.attname = any($2::text[])
"""


#: a table's columns (names, types, modifiers) and the tables it is a partition of (a
#: partition detached or attached is published as another table), as one value (SQL;
#: ``{rel}``: its oid; null when there is no such table)
SHAPE = ("(select md5(string_agg(a.attname || ':' || a.atttypid || ':' || a.atttypmod, ',' "
         "order by a.attnum) || ';' || coalesce((with recursive up(oid) as (select "
         "i.inhparent from pg_inherits i where i.inhrelid = {rel} union all select "
         "i.inhparent from pg_inherits i join up on i.inhrelid = up.oid) "
         "select string_agg(oid::text, ',') from up), '')) from pg_attribute a "
         "where a.attrelid = {rel} and a.attnum > 0 and not a.attisdropped)")


async def table_shapes(sql: SqlSession) -> dict[tuple[str, str], str]:
    """``SHAPE`` of every table: read before the catalog a job is planned from, so a DDL
    that changes a table's columns after this read shows as another shape at a chunk."""
    rows = await sql.fetch(
        "select n.nspname::text as s, c.relname::text as t, "
        + SHAPE.format(rel="c.oid") + " as shape from pg_class c "
        "join pg_namespace n on n.oid = c.relnamespace where c.relkind in ('r', 'p') "
        "and n.nspname not in ('pg_catalog', 'information_schema')")
    return {(r["s"], r["t"]): r["shape"] for r in rows}


def shape_tables(job: "Job") -> tuple[tuple[str, str], ...]:
    """The tables whose columns make the job's rows: the leaf read, and the table it is
    published as (its root, via ``publish_via_partition_root``)."""
    rel = job.table.relation
    return (job.table.table, (rel.namespace, rel.name))


class Job(msgspec.Struct):
    request: str
    route: str
    table: SnapshotTable
    key: tuple[str, ...]
    key_types: tuple[str, ...]
    row_key: tuple[int, ...]
    last_key: tuple | None = None
    rows: int = 0
    #: a repair's keys (``router.snapshot.core.Watermark.keys``): only these rows, one chunk
    keys: tuple = ()
    #: the route's ``SnapshotRows`` (with the type names of the request's tables)
    encoder: object = None
    #: block ranges not to read again (``done_ranges``)
    skip: tuple = ()
    #: the table's ``pg_relation_filenode`` those ranges are blocks of
    filenode: int = 0
    #: the ``SHAPE`` of ``shape_tables`` before the catalog the job was planned from
    shape: tuple = ()
    #: only the rows this condition matches (a signal's ``where``), "" for all
    where: str = ""

    @property
    def name(self) -> str:
        return self.table.name


async def table_key(sql: SqlSession, table: SnapshotTable) -> tuple[tuple, tuple, tuple]:
    """(key columns, their SQL types, their positions in the rows), empty without a key."""
    rel = table.relation
    qname = f"{ident(table.table[0])}.{ident(table.table[1])}"
    if rel.replica_identity == "f":
        key = tuple(await sql.fetchval(_PRIMARY_KEY, qname) or ())
    else:
        key = tuple(c.name for c in rel.columns if c.flags & 1)
    names = [c.name for c in rel.columns]
    if not key or not set(key) <= set(names):
        return (), (), ()
    types = {r["name"]: r["type"] for r in await sql.fetch(_TYPES, qname, list(key))}
    if set(types) != set(key):
        return (), (), ()
    return key, tuple(types[k] for k in key), tuple(names.index(k) for k in key)


def route_rows(cfg: Config, catalog, db: str, route: str, type_names: dict,
               primary_keys: dict | None = None) -> SnapshotRows:
    """The route's snapshot records; ``primary_keys`` key them as the stream's records are
    keyed (``router.routing.keys``)."""
    return SnapshotRows(ChangeRouter(snapshot_specs(cfg, catalog, {route}), db=db,
                                     type_names=type_names, primary_keys=primary_keys),
                        position_headers=cfg.kafka.position_headers)


async def plan_jobs(sql: SqlSession, cfg: Config, catalog, db: str, request: str,
                    routes: list[str], tables: list[str], type_names, *,
                    whole_keyless: bool = False, keys: tuple = (), where: str = ""
                    ) -> tuple[list[Job], list[str]]:
    """The jobs of a request, and the problems that refuse parts of it (one line each)."""
    problems: list[str] = []
    known = {r.name for r in cfg.routes}
    only = None
    if tables:
        only = set()
        for t in tables:
            try:
                only.add(qualified(t))
            except ConfigError:
                problems.append(f"table {t!r}: write it schema.table")
    leaves = slot_tables(cfg, catalog, only)
    found: set = set()
    if only:
        found = {t.table for t in leaves} | {a for t in leaves
                                            for a in catalog.tables[t.table].ancestors}
        for t in sorted(only - found):
            problems.append(f"table {t[0]}.{t[1]} is not streamed by the slot's publications "
                            "(source.publications)")
    names = await type_names(sql, leaves)
    jobs = []
    for route in routes:
        if route not in known:
            problems.append(f"route {route!r} is not in the config")
            continue
        rows = route_rows(cfg, catalog, db, route, names)
        taken = [t for t in leaves if rows.routed(t.relation)]
        if only:
            # every table named must be taken: one the route does not take is refused, never
            # silently left out of the request
            covered = {t.table for t in taken} | {a for t in taken
                                                   for a in catalog.tables[t.table].ancestors}
            for t in sorted((only & found) - covered):
                problems.append(f"route {route!r} does not take table {t[0]}.{t[1]}")
        for t in taken:
            key, types, row_key = await table_key(sql, t)
            if not key and not whole_keyless:
                problems.append(f"table {t.name} has no primary key or replica identity "
                                "index: it cannot be backfilled in chunks (only the initial "
                                "snapshot copies it)")
                continue
            bad = where and where_problem(where, catalog.tables[t.table].columns)
            if bad:
                problems.append(f"table {t.name}: {bad}")
                continue
            jobs.append(Job(request, route, t, key, types, row_key, keys=tuple(keys),
                            where=where))
    return jobs, problems


async def done_ranges(sql: SqlSession, cfg: Config, catalog, states, slot: str,
                      jobs: list[Job]) -> None:
    """Jobs finishing the interrupted initial snapshot of ``slot`` skip the block ranges of
    their table it recorded done (``states``: the state topic's records): those rows are
    in Kafka as of the consistent point, and every later change of them is in the stream.
    A row that was in a range not done and moved into a done one since was moved by an
    update, which the stream carries: so only for routes that publish UPDATE of the
    table, and not when the table was rewritten since (VACUUM FULL, CLUSTER: another
    ``pg_relation_filenode``, the rows moved) — also when that happens during the backfill
    (a chunk whose read finds another filenode reads every block: ``BackfillActor``)."""
    streaming = ChangeRouter([s for s in build_route_specs(cfg, catalog, skip_missing=True)
                              if s is not None], db="")
    states = list(states)
    initial = [p for p in states if p.kind == "initial" and p.slot == slot]
    snapshot = initial[-1].request if initial else ""
    filenodes: dict[str, int] = {}
    for job in jobs:
        plans = [p for p in streaming.plans_for(job.table.relation) if p.route == job.route]
        if not plans or not all(p.publish_update for p in plans):
            continue
        if job.name not in filenodes:
            filenodes[job.name] = int(await sql.fetchval(
                "select pg_relation_filenode(to_regclass($1))::int8",
                f"{ident(job.table.table[0])}.{ident(job.table.table[1])}") or 0)
        job.skip = tuple(done_blocks(states, slot, snapshot, job.name, filenodes[job.name]))
        job.filenode = filenodes[job.name]
        if job.skip:
            log.event(_log, "backfill leaves out the block ranges the initial snapshot did",
                      route=job.route, table=job.name,
                      blocks=" ".join(f"{a}-{'' if b is None else b}" for a, b in job.skip))
