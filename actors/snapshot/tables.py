"""Which tables a snapshot reads, as what, and what each route makes of their rows.

Rules (PostgreSQL's initial table sync, ``tablesync.c`` ``fetch_remote_table_info``):

* A table in several publications of one route is copied with the OR of their row filters,
  and without a filter when any of them has none (FOR ALL TABLES, TABLES IN SCHEMA, or a
  plain listing) — whatever actions they publish: the copy is not an INSERT, every
  publication contributes. The column list and ``publish_via_partition_root`` are the
  stream's (``router.routing.publications.resolve``). Config routes keep their own ``where`` and
  ``columns``; selector routes take every row.
* Only leaf tables are read (``FROM ONLY``): a partition's rows go to its root's topic when
  the route publishes via the root, exactly as its streamed changes do (``TablePlan.row_map``).
* Only what the slot streams is read: a table none of ``[source] publications`` publishes
  gets no snapshot; the rows are read as the slot sends them — as the slot's
  ``publish_as`` table (its columns by name, from the leaf), with the slot's column list,
  and only rows the slot's publications' filters (combined as above) let through, evaluated
  by PostgreSQL in the ``WHERE`` of the read.
* A table's snapshot relation is what a Relation message of the stream would say, so the
  records' keys, schemas and topics are the streamed ones.
"""

from __future__ import annotations

import itertools

import msgspec

from router.config.router import Config, qualified
from router.pgoutput import Relation
from router.pgoutput.messages import RelationColumn
from router.routing.publications import (Catalog, FilterCache, Planner, Publication, TableInfo,
                                 config_resolver, publication_resolver, resolve)
from router.routing.change_router import RouteSpec

from ..services.transforms import route_spec

ALL_ACTIONS = frozenset({"insert", "update", "delete", "truncate"})
_ids = itertools.count(1 << 33)  # relation ids no server oid can take


def as_copied(pub: Publication) -> Publication:
    """A publication as the initial copy sees it: every action contributes its filter."""
    return msgspec.structs.replace(pub, insert=True, update=True, delete=True)


def snapshot_specs(cfg: Config, catalog: Catalog, routes: set[str] | None = None
                   ) -> list[RouteSpec]:
    """Route specs whose plans are what the initial copy does for each route (all of them,
    or the ``routes`` named)."""
    filters = FilterCache()
    specs = []
    for r in cfg.routes:
        if (routes is not None and r.name not in routes) or r.outbox is not None:
            continue  # (an outbox route is never snapshotted: router.routing.outbox)
        tables = frozenset(qualified(t) for t in r.tables)
        planner = None
        if r.publication_names():
            pubs = [as_copied(catalog.publications[p]) for p in r.publication_names()]
            planner = Planner(r.name, publication_resolver(pubs, catalog), ALL_ACTIONS,
                              catalog.tables, filters)
        elif r.where or r.columns:
            planner = Planner(r.name, config_resolver(tables, r.where, r.columns), ALL_ACTIONS,
                              catalog.tables, filters)
        specs.append(route_spec(r, cfg.routes.index(r), tables=tables, ops=ALL_ACTIONS,
                                planner=planner))
    return specs


class SnapshotTable(msgspec.Struct, frozen=True):
    """One leaf table to read."""

    table: tuple[str, str]  # the leaf read
    relation: Relation  # its rows as the slot sends them
    where: str | None  # the slot's publications' filter for the copy (SQL), None: all rows

    @property
    def name(self) -> str:
        return f"{self.table[0]}.{self.table[1]}"

    def select(self, blocks: tuple[int, int | None] = (0, None)) -> str:
        """The read of the table, or of its rows in the blocks ``[first, end)`` (``end``
        None: to the end; ``router.snapshot.core.block_ranges``)."""
        cols = ", ".join(ident(c.name) for c in self.relation.columns)
        sql = f"SELECT {cols} FROM ONLY {ident(self.table[0])}.{ident(self.table[1])}"
        conds = [] if self.where is None else [f"({self.where})"]
        first, end = int(blocks[0]), blocks[1]
        if first:
            conds.append(f"ctid >= '({first},0)'::tid")
        if end is not None:
            conds.append(f"ctid < '({int(end)},0)'::tid")
        return sql if not conds else f"{sql} WHERE {' AND '.join(conds)}"

    @staticmethod
    def outside(spans: tuple) -> list[str]:
        """Conditions that leave out the rows in the blocks of ``spans`` (``[first, end)``,
        end None: to the end)."""
        conds = []
        for first, end in spans:
            inside = [f"ctid >= '({int(first)},0)'::tid"] if first else []
            if end is not None:
                inside.append(f"ctid < '({int(end)},0)'::tid")
            conds.append(f"NOT ({' AND '.join(inside) or 'true'})")
        return conds


    def chunk_select(self, key: tuple[str, ...], key_types: tuple[str, ...],
                     after: tuple | None, limit: int | None,
                     keys: tuple = (), skip: tuple = (), where: str = ""
                     ) -> tuple[str, tuple]:
        """The next chunk by key order: rows whose key is after ``after`` (text values),
        ``limit`` of them, only those of ``keys`` when given (``keys_json``), none in the
        blocks of ``skip`` (``outside``), only those ``where`` matches (a signal's condition,
        checked by ``router.snapshot.signals.where_problem``): SQL with ``$n`` parameters, and the
        parameters."""
        cols = ", ".join(ident(c.name) for c in self.relation.columns)
        sql = f"SELECT {cols} FROM ONLY {ident(self.table[0])}.{ident(self.table[1])}"
        conds = [] if self.where is None else [f"({self.where})"]
        conds += self.outside(skip)
        if where:  # as written: a line comment at its end ends at the newline
            conds.append(f"({where}\n)")
        params: tuple = ()
        names = ", ".join(ident(k) for k in key)
        if after is not None:
            vals = ", ".join(f"${i}::text::{t}" for i, t in enumerate(key_types, start=1))
            conds.append(f"({names}) > ({vals})" if len(key) > 1 else f"{names} > {vals}")
            params = tuple(after)
        if keys:
            conds.append(f"({names}) IN (SELECT {_elements(key_types)} FROM "
                         f"jsonb_array_elements(${len(params) + 1}::jsonb) e(v))")
            params += (keys_json(keys),)
        if conds:
            sql += " WHERE " + " AND ".join(conds)
        if key:
            sql += " ORDER BY " + ", ".join(ident(k) for k in key)
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return sql, params


    def absent_select(self, key: tuple[str, ...], key_types: tuple[str, ...]) -> str:
        """The keys of ``$1`` (``keys_json``) no row of the table as published holds (its
        root's, for a partition published via its root) that the slot's filter passes, as
        the key columns' text (what the stream's keys are)."""
        rel = self.relation
        own = (rel.namespace, rel.name) == self.table
        table = f"{'ONLY ' if own else ''}{ident(rel.namespace)}.{ident(rel.name)}"
        names = ", ".join(ident(k) for k in key)
        conds = [] if self.where is None else [f"({self.where})"]
        conds.append(f"({names}) = ({_elements(key_types)})")
        texts = ", ".join(f"((e.v->>{i})::{t})::text" for i, t in enumerate(key_types))
        return (f"SELECT {texts} FROM jsonb_array_elements($1::jsonb) e(v) WHERE NOT EXISTS "
                f"(SELECT 1 FROM {table} WHERE {' AND '.join(conds)})")


def keys_json(keys: tuple) -> str:
    """A repair's keys as the JSON array ``chunk_select`` and ``absent_select`` read."""
    return msgspec.json.encode([list(k) for k in keys]).decode()


def _elements(key_types: tuple[str, ...]) -> str:
    return ", ".join(f"(e.v->>{i})::{t}" for i, t in enumerate(key_types))


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def relation_of(info: TableInfo, columns: frozenset[str] | None) -> Relation:
    cols = tuple(RelationColumn(1 if c.key else 0, c.name, c.type_oid, c.type_modifier)
                 for c in info.columns if columns is None or c.name in columns)
    return Relation(relation_id=next(_ids), namespace=info.schema, name=info.name,
                    replica_identity=info.replica_identity, columns=cols)


def slot_tables(cfg: Config, catalog: Catalog, only: set[tuple[str, str]] | None = None
                ) -> list[SnapshotTable]:
    """Every leaf table the slot streams (or those of ``only``, by leaf or partitioned
    table name), as the slot sends it."""
    slot_pubs = [as_copied(catalog.publications[p]) for p in cfg.source.publications
                 if p in catalog.publications]
    out = []
    for info in sorted(catalog.tables.values(), key=lambda t: t.qualified):
        if info.relkind != "r":
            continue
        if only is not None and info.qualified not in only and not (
                set(info.ancestors) & only):
            continue
        res = resolve(info, slot_pubs, catalog.tables)
        if res is None:
            continue
        as_info = catalog.tables.get(res.publish_as, info)
        filters = res.insert_filters
        where = None if not filters else " OR ".join(f"({f})" for f in filters)
        out.append(SnapshotTable(info.qualified, relation_of(as_info, res.columns), where))
    return out
