"""Publication semantics: which changes of a table a set of publications replicates, and how.

This mirrors PostgreSQL 15's ``pgoutput.c`` (``get_rel_sync_entry``,
``pgoutput_row_filter_init``, ``pgoutput_column_list_init``) over catalog definitions read
elsewhere (``actors/services/catalog.py``); nothing here does I/O.

Rules, for one table and a list of publications (``resolve``):

* A publication publishes the table when it is FOR ALL TABLES, lists the table, has the
  table's schema (TABLES IN SCHEMA), or — for a partition — publishes one of its ancestors.
  A partitioned table itself is only published by a ``publish_via_partition_root``
  publication (otherwise its partitions carry its changes).
* ``publish_as``: with ``publish_via_partition_root`` a partition's changes are published as
  the topmost ancestor that publication includes (the root for FOR ALL TABLES). Across
  publications the topmost one wins; only the publications at that level contribute row
  filters and column lists, but the published actions are OR-ed over all of them.
* Row filters, per action: only publications publishing the action contribute; their
  filters are OR-ed; one without a filter for ``publish_as`` (no WHERE, FOR ALL TABLES, TABLES
  IN SCHEMA covering ``publish_as``'s schema, or no row for ``publish_as`` because the table is
  published through an ancestor) removes filtering for the actions it publishes.
* Column lists: FOR ALL TABLES / TABLES IN SCHEMA / no list mean all columns; a list naming
  every live column is no list; the publications at the winning level must agree exactly,
  otherwise it is an error, as in PostgreSQL (``cannot use different column lists``). Columns
  are published in table order, not list order.
* Generated columns (PostgreSQL 18, ``logicalrep_should_publish_column``): a stored generated
  column is published when a column list names it, or, without a list, when the publication
  has ``publish_generated_columns = stored``; otherwise "all columns" means the
  non-generated ones. The catalog lists generated columns only for servers that can publish
  them (18+), so on older servers nothing changes.
* TRUNCATE is never row-filtered; a partition's TRUNCATE is not published when the partition
  is published as an ancestor.
"""

from __future__ import annotations

from typing import Callable

import msgspec

from ..errors import ConfigError
from ..pgoutput import Relation, RelationColumn
from ..rowfilter import ColumnType, RowFilter, compile_filter

RowPredicate = Callable[[tuple], bool]

TableName = tuple[str, str]  # (schema, table)


class PubTable(msgspec.Struct, frozen=True):
    """One ``pg_publication_rel`` row: a table listed in a publication."""

    where: str | None = None  # pg_get_expr(prqual, prrelid), without the outer WHERE
    columns: tuple[str, ...] | None = None  # prattrs as names; None = all


class Publication(msgspec.Struct, frozen=True):
    name: str
    all_tables: bool = False
    insert: bool = True
    update: bool = True
    delete: bool = True
    truncate: bool = True
    via_root: bool = False
    schemas: frozenset[str] = frozenset()
    tables: dict[TableName, PubTable] = {}
    #: ``publish_generated_columns = stored`` (PostgreSQL 18)
    generated_columns: bool = False

    def actions(self) -> frozenset[str]:
        return frozenset(a for a in ("insert", "update", "delete", "truncate")
                         if getattr(self, a))


class CatalogColumn(msgspec.Struct, frozen=True):
    name: str
    type_oid: int
    type_modifier: int = -1
    key: bool = False  # part of the replica identity (every column with REPLICA IDENTITY FULL)
    generated: bool = False  # a stored generated column (listed by the catalog on 18+ only)


class TableInfo(msgspec.Struct, frozen=True):
    """A table as the catalog describes it (live columns in attnum order; stored generated
    ones only where the server can publish them)."""

    schema: str
    name: str
    relkind: str = "r"  # 'r' table, 'p' partitioned table
    #: parent first, root last (``get_partition_ancestors``); empty unless a partition
    ancestors: tuple[TableName, ...] = ()
    columns: tuple[CatalogColumn, ...] = ()
    replica_identity: str = "d"  # relreplident: d, n, f, i
    #: leaf partitions (for a partitioned table)
    leaves: frozenset[TableName] = frozenset()

    @property
    def qualified(self) -> TableName:
        return (self.schema, self.name)


class Catalog(msgspec.Struct, frozen=True):
    publications: dict[str, Publication]
    tables: dict[TableName, TableInfo]


class Resolved(msgspec.Struct, frozen=True):
    """What a set of publications replicates of one table. Filters are tuples of SQL
    expressions to OR (None: that action is not filtered)."""

    publish_as: TableName
    insert: bool
    update: bool
    delete: bool
    truncate: bool
    insert_filters: tuple[str, ...] | None = None
    update_filters: tuple[str, ...] | None = None
    delete_filters: tuple[str, ...] | None = None
    columns: frozenset[str] | None = None  # None: every column


class ColumnListConflict(ConfigError):
    """Publications combined for one table have different column lists (PostgreSQL refuses
    this too)."""


def _in_publication(pub: Publication, table: TableName, tables: dict[TableName, TableInfo]) -> bool:
    """Listed directly or through its schema (``GetRelationPublications`` +
    ``GetSchemaPublications``)."""
    return table in pub.tables or table[0] in pub.schemas


def _topmost_ancestor(pub: Publication, ancestors: tuple[TableName, ...],
                      tables: dict) -> tuple[TableName | None, int]:
    """``GetTopMostAncestorInPublication``: the highest ancestor ``pub`` includes, and its level
    (1 = parent)."""
    found, level = None, 0
    for i, anc in enumerate(ancestors, start=1):
        if _in_publication(pub, anc, tables):
            found, level = anc, i
    return found, level


def resolve(table: TableInfo, publications: list[Publication],
            tables: dict[TableName, TableInfo]) -> Resolved | None:
    """What ``publications`` (as one subscription would combine them) replicate of ``table``;
    None when none of them publishes it."""
    relid = table.qualified
    am_partition = bool(table.ancestors)
    actions = {"insert": False, "update": False, "delete": False, "truncate": False}
    publish_as, publish_level = relid, 0
    rel_pubs: list[Publication] = []
    for pub in publications:
        publish = False
        pub_relid, level = relid, 0
        if pub.all_tables:
            publish = True
            if pub.via_root and am_partition:
                pub_relid, level = table.ancestors[-1], len(table.ancestors)
        if not publish:
            ancestor_published = False
            if am_partition:
                anc, anc_level = _topmost_ancestor(pub, table.ancestors, tables)
                if anc is not None:
                    ancestor_published = True
                    if pub.via_root:
                        pub_relid, level = anc, anc_level
            publish = _in_publication(pub, relid, tables) or ancestor_published
        if not publish or (table.relkind == "p" and not pub.via_root):
            continue
        for a in actions:
            actions[a] |= getattr(pub, a)
        if publish_level > level:
            continue
        if publish_level < level:
            publish_as, publish_level = pub_relid, level
            rel_pubs = []
        rel_pubs.append(pub)
    if not rel_pubs:
        return None
    as_info = tables.get(publish_as, table if publish_as == relid else None)
    filters = _row_filters(publish_as, rel_pubs) if (
        actions["insert"] or actions["update"] or actions["delete"]) else (None, None, None)
    columns = _column_list(publish_as, as_info, rel_pubs)
    return Resolved(publish_as=publish_as, insert=actions["insert"], update=actions["update"],
                    delete=actions["delete"], truncate=actions["truncate"],
                    insert_filters=filters[0], update_filters=filters[1],
                    delete_filters=filters[2], columns=columns)


_DML = ("insert", "update", "delete")


def _row_filters(publish_as: TableName, pubs: list[Publication]):
    """``pgoutput_row_filter_init``: per action, OR of the filters, or None (unfiltered)."""
    nodes: dict[str, list[str]] = {a: [] for a in _DML}
    no_filter = {a: False for a in _DML}
    for pub in pubs:
        where = None
        if not pub.all_tables and publish_as[0] not in pub.schemas:
            entry = pub.tables.get(publish_as)
            if entry is not None:
                where = entry.where
        if where is None:
            for a in _DML:
                no_filter[a] |= getattr(pub, a)
            if all(no_filter.values()):
                break
            continue
        for a in _DML:
            if getattr(pub, a) and not no_filter[a]:
                nodes[a].append(where)
    out = []
    for a in _DML:
        if no_filter[a] or not nodes[a]:
            out.append(None)
        else:
            out.append(tuple(dict.fromkeys(nodes[a])))  # same text twice is one filter
    return tuple(out)


def _column_list(publish_as: TableName, info: TableInfo | None,
                 pubs: list[Publication]) -> frozenset[str] | None:
    """``pgoutput_column_list_init``: the one column list all ``pubs`` agree on."""
    first = True
    result: frozenset[str] | None = None
    for pub in pubs:
        cols = None
        if not pub.all_tables:
            entry = pub.tables.get(publish_as)
            if entry is not None and entry.columns is not None:
                cols = frozenset(entry.columns)
                if info is not None and len(cols) == len(info.columns):
                    cols = None
        if cols is None and info is not None and not pub.generated_columns and any(
                c.generated for c in info.columns):
            cols = frozenset(c.name for c in info.columns if not c.generated)
        if first:
            result, first = cols, False
        elif cols != result:
            raise ColumnListConflict(
                f"cannot use different column lists for table \"{publish_as[0]}."
                f"{publish_as[1]}\" in different publications "
                f"({', '.join(p.name for p in pubs)})")
    return result


def config_publication(name: str, tables: list[TableName], schemas: list[str],
                       all_tables: bool, operations: frozenset[str], where: str | None,
                       columns: list[str] | None) -> Publication:
    """A route written in the config file, seen as the publication it describes
    (``FOR TABLE t WHERE (…) (cols)``, ``FOR TABLES IN SCHEMA``, ``FOR ALL TABLES``).
    Schema patterns (``fnmatch``) are matched by the caller."""
    entry = PubTable(where=where or None, columns=tuple(columns) if columns else None)
    return Publication(
        name=name, all_tables=all_tables, insert="insert" in operations,
        update="update" in operations, delete="delete" in operations,
        truncate="truncate" in operations, schemas=frozenset(schemas),
        tables={t: entry for t in tables})


# -- plans: what plans.TablePlan needs, per relation layout ------------------------------------


class FilterCache:
    """Compiled filters shared by every route: one ``RowFilter`` per (expression, layout), so
    routes with the same filter share it (and the router evaluates it once per change)."""

    def __init__(self) -> None:
        self._filters: dict = {}

    def get(self, sql: str, columns: tuple) -> RowFilter:
        key = (sql, columns)
        f = self._filters.get(key)
        if f is None:
            f = self._filters[key] = compile_filter(sql, columns)
        return f


def any_of(filters: tuple) -> RowPredicate:
    """OR of compiled filters with SQL semantics: NULL counts as false."""
    if len(filters) == 1:
        return filters[0].matches

    def matches(row) -> bool:
        for f in filters:
            if f.evaluate(row) is True:
                return True
        return False
    matches.filters = filters  # type: ignore[attr-defined]
    return matches


def relation_view(info: TableInfo, keep=None) -> Relation:
    """A Relation message's view of a catalog table (``keep``: which columns), for tables the
    stream does not describe itself (an ancestor a partition is published as)."""
    return Relation(relation_id=0, namespace=info.schema, name=info.name,
                    replica_identity=info.replica_identity,
                    columns=tuple(RelationColumn(1 if c.key else 0, c.name, c.type_oid,
                                                 c.type_modifier)
                                  for c in info.columns if keep is None or keep(c)))


class Planner:
    """``RouteSpec.planner`` for a route: ``resolver(table, relation)`` says what the route
    replicates of a table (a ``Resolved``); this turns it into ``TablePlan`` fields for the
    relation layout at hand, cached by layout. Publishing as an ancestor maps the partition's
    row to the ancestor's column order by name."""

    def __init__(self, route: str, resolver, operations: frozenset[str],
                 tables: dict[TableName, TableInfo], filters: FilterCache):
        self.route = route
        self._resolver = resolver
        self._ops = operations
        self._tables = tables
        self._filters = filters
        self._plans: dict = {}

    def __call__(self, relation: Relation) -> dict | None:
        key = (relation.namespace, relation.name, relation.replica_identity, relation.columns)
        try:
            return self._plans[key]
        except KeyError:
            plan = self._plans[key] = self._plan(relation)
            return plan

    def relation_of(self, table: TableName) -> Relation | None:
        """The catalog's view of ``table`` (None when the catalog does not know it)."""
        info = self._tables.get(table)
        return None if info is None else relation_view(info)

    def _error(self, relation: Relation, message: str) -> ConfigError:
        return ConfigError(f"route {self.route!r}, table {relation.namespace}.{relation.name}: "
                           f"{message}", path="routes")

    def _plan(self, relation: Relation) -> dict | None:
        table = (relation.namespace, relation.name)
        res = self._resolver(table, relation)
        if res is None:
            return None
        ops = self._ops
        plan: dict = {"publish_insert": res.insert and "insert" in ops,
                      "publish_update": res.update and "update" in ops,
                      "publish_delete": res.delete and "delete" in ops,
                      "publish_truncate": res.truncate and "truncate" in ops}
        if not any(plan.values()):
            return None
        view = relation
        if res.publish_as != table:
            root = self._tables.get(res.publish_as)
            if root is None:
                raise self._error(relation, f"ancestor {res.publish_as} is not in the catalog")
            pos = {c.name: i for i, c in enumerate(relation.columns)}
            view = relation_view(root, lambda c: c.name in pos)
            plan["publish_as"] = view
            plan["row_map"] = tuple(pos[c.name] for c in view.columns)
            plan["via_ancestor"] = True
        if res.columns is not None:
            present = {c.name for c in view.columns}
            if res.columns - present:
                raise self._error(relation, "the slot's publications do not send column(s) "
                                  f"{sorted(res.columns - present)} of the column list")
            plan["columns"] = tuple(i for i, c in enumerate(view.columns) if c.name in res.columns)
        ctypes = tuple(ColumnType(c.name, c.type_oid, c.type_modifier) for c in view.columns)
        used: set[str] = set()
        for action in ("insert", "update", "delete"):
            sqls = getattr(res, f"{action}_filters")
            if sqls and plan[f"publish_{action}"]:
                try:
                    compiled = tuple(self._filters.get(s, ctypes) for s in sqls)
                except ConfigError as exc:
                    raise self._error(relation, f"row filter: {exc}") from exc
                plan[f"{action}_filter"] = any_of(compiled)
                used.update(n for f in compiled for n in f.columns_used)
        index = {c.name: i for i, c in enumerate(view.columns)}
        row_map = plan.get("row_map")
        plan["filter_columns"] = tuple(sorted(
            row_map[index[n]] if row_map is not None else index[n] for n in used))
        return plan


def publication_resolver(publications: list[Publication], catalog: Catalog):
    """Resolver for a route defined by catalog publications."""
    def resolver(table: TableName, relation: Relation) -> Resolved | None:
        info = catalog.tables.get(table) or table_from_relation(relation)
        return resolve(info, publications, catalog.tables)
    return resolver


def config_resolver(tables: frozenset[TableName], where: str | None,
                    columns: list[str] | None):
    """Resolver for a ``tables = [...]`` route with a config-written ``where``/``columns``:
    the listed tables exactly as named (no partition semantics)."""
    filters = (where,) if where else None
    cols = frozenset(columns) if columns else None

    def resolver(table: TableName, relation: Relation) -> Resolved | None:
        if table not in tables:
            return None
        return Resolved(publish_as=table, insert=True, update=True, delete=True, truncate=True,
                        insert_filters=filters, update_filters=filters, delete_filters=filters,
                        columns=cols)
    return resolver


def table_from_relation(relation: Relation) -> TableInfo:
    """A table the catalog did not know (created after it was read), as its Relation says."""
    return TableInfo(schema=relation.namespace, name=relation.name,
                     columns=tuple(CatalogColumn(c.name, c.type_oid, c.type_modifier,
                                                 bool(c.flags & 1)) for c in relation.columns),
                     replica_identity=relation.replica_identity)
