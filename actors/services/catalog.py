"""Publication and table definitions read from PostgreSQL's catalog, and the route specs
built from them.

Rules:

* Read once at startup and again on SIGHUP (``Supervisor``); the core never queries. What is
  read is the *current* catalog, not the historic snapshot pgoutput decodes with: a changed
  publication applies from the next transaction the router sees after the reload.
* Tables: every ordinary and partitioned table outside the system schemas, with live
  columns in attnum order (what a Relation message can list: non-generated ones, and on
  PostgreSQL 18+ stored generated ones, flagged, which publications may publish), the replica
  identity key (``relreplident``: primary key for DEFAULT, the ``indisreplident`` index for
  USING INDEX, every column for FULL, none for NOTHING), partition ancestors
  (``pg_inherits``, parent first) and leaf partitions.
* Publications: ``pg_publication`` (actions, ``puballtables``, ``pubviaroot``, ``pubgencols``
  on 18+), ``pg_publication_namespace`` (TABLES IN SCHEMA), ``pg_publication_rel`` (the row
  filter as ``pg_get_expr(prqual, prrelid)`` prints it, the column list as names).
"""

from __future__ import annotations

import fnmatch

from router.config.router import Config, qualified
from router.errors import ConfigError, PublicationMissing
from router.routing.publications import (Catalog, CatalogColumn, FilterCache, Planner, PubTable,
                                 Publication, Resolved, TableInfo, config_resolver,
                                 publication_resolver, resolve)
from router.rowfilter import ColumnType, compile_filter
from router.routing.change_router import RouteSpec

from .sql import SqlSession
from .transforms import route_spec

_USER_TABLES = """
    c.relkind in ('r', 'p')
    and n.nspname not in ('pg_catalog', 'information_schema')
    and n.nspname not like 'pg\\_toast%' and n.nspname not like 'pg\\_temp\\_%'
"""

_TABLES = f"""
select c.oid, n.nspname, c.relname, c.relkind::text as relkind, c.relreplident::text as ident
from pg_class c join pg_namespace n on n.oid = c.relnamespace
where {_USER_TABLES}
"""

#: PostgreSQL 18 publishes stored generated columns (publish_generated_columns, column lists)
GENERATED_COLUMNS_MIN_VERSION = 180000

_COLUMNS = f"""
select a.attrelid, a.attnum, a.attname, a.atttypid::int8 as typid, a.atttypmod,
       a.attgenerated = 's' as generated
from pg_attribute a join pg_class c on c.oid = a.attrelid
join pg_namespace n on n.oid = c.relnamespace
where {_USER_TABLES} and a.attnum > 0 and not a.attisdropped and a.attgenerated in ({{gen}})
order by a.attrelid, a.attnum
"""

# text[]: an int2[] makes asyncpg ask the server for its type (four more queries a session)
_KEYS = """
select i.indrelid, i.indkey::int2[]::text[] as keys, i.indisprimary, i.indisreplident
from pg_index i where (i.indisprimary or i.indisreplident) and i.indisvalid
"""

_INHERITS = """
select i.inhrelid, i.inhparent from pg_inherits i
join pg_class p on p.oid = i.inhparent where p.relkind = 'p'
"""

_PUBLICATIONS = """
select p.oid, p.pubname, p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete,
       p.pubtruncate, p.pubviaroot, {gencols} as gencols,
       coalesce((select array_agg(n.nspname::text) from pg_publication_namespace pn
                 join pg_namespace n on n.oid = pn.pnnspid where pn.pnpubid = p.oid),
                '{{}}') as schemas
from pg_publication p where p.pubname = any($1::text[])
"""

_PUBLICATION_RELS = """
select p.pubname, n.nspname, c.relname, pg_get_expr(pr.prqual, pr.prrelid) as qual,
       (select array_agg(a.attname::text order by a.attnum) from pg_attribute a
        where a.attrelid = pr.prrelid and a.attnum = any(pr.prattrs::int2[])) as cols,
       pr.prattrs is not null as has_cols
from pg_publication_rel pr join pg_publication p on p.oid = pr.prpubid
join pg_class c on c.oid = pr.prrelid join pg_namespace n on n.oid = c.relnamespace
where p.pubname = any($1::text[])
"""

_PRIMARY_KEYS = """
select n.nspname, c.relname,
       array_agg(a.attname::text order by array_position(i.indkey::int2[], a.attnum)) as cols
from pg_index i
join pg_class c on c.oid = i.indrelid
join pg_namespace n on n.oid = c.relnamespace
join pg_attribute a on a.attrelid = c.oid and a.attnum = any(i.indkey::int2[])
where i.indisprimary and ($1::text[] is null or (n.nspname || '.' || c.relname) = any($1::text[]))
group by n.nspname, c.relname
"""


async def load_primary_keys(sql: SqlSession, tables: list[tuple[str, str]] | None = None
                            ) -> dict[tuple[str, str], tuple[str, ...]]:
    """Primary key columns (in index order) of every table, or of ``tables``; a table asked
    for that has none maps to ``()``. They key the records (``router.routing.keys``)."""
    names = None if tables is None else [f"{s}.{t}" for s, t in tables]
    found = {(r["nspname"], r["relname"]): tuple(r["cols"])
             for r in await sql.fetch(_PRIMARY_KEYS, names)}
    return {**found, **{table: () for table in tables or () if table not in found}}


async def _publishes_generated(sql: SqlSession) -> bool:
    version = int(await sql.fetchval("select current_setting('server_version_num')"))
    return version >= GENERATED_COLUMNS_MIN_VERSION


async def load_tables(sql: SqlSession) -> dict[tuple[str, str], TableInfo]:
    rels = {r["oid"]: r for r in await sql.fetch(_TABLES)}
    columns: dict[int, list] = {}
    gen = "'', 's'" if await _publishes_generated(sql) else "''"
    for r in await sql.fetch(_COLUMNS.format(gen=gen)):
        columns.setdefault(r["attrelid"], []).append(r)
    pk: dict[int, set] = {}
    ri: dict[int, set] = {}
    for r in await sql.fetch(_KEYS):
        for wanted, into in ((r["indisprimary"], pk), (r["indisreplident"], ri)):
            if wanted:
                into[r["indrelid"]] = set(map(int, r["keys"]))
    parent: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    for r in await sql.fetch(_INHERITS):
        parent[r["inhrelid"]] = r["inhparent"]
        children.setdefault(r["inhparent"], []).append(r["inhrelid"])

    def name(oid):
        return (rels[oid]["nspname"], rels[oid]["relname"])

    def leaves(oid):
        out, stack = set(), list(children.get(oid, ()))
        while stack:
            o = stack.pop()
            if o in children:
                stack.extend(children[o])
            elif o in rels:
                out.add(name(o))
        return frozenset(out)

    tables = {}
    for oid, r in rels.items():
        ident = r["ident"]
        keys = {"d": pk.get(oid, set()), "i": ri.get(oid, set()), "n": set()}.get(ident)
        cols = tuple(CatalogColumn(c["attname"], c["typid"], c["atttypmod"],
                                   ident == "f" or c["attnum"] in keys, c["generated"])
                     for c in columns.get(oid, ()))
        ancestors, o = [], oid
        while o in parent and parent[o] in rels:
            o = parent[o]
            ancestors.append(name(o))
        tables[name(oid)] = TableInfo(
            schema=r["nspname"], name=r["relname"], relkind=r["relkind"],
            ancestors=tuple(ancestors), columns=cols, replica_identity=ident,
            leaves=leaves(oid) if r["relkind"] == "p" else frozenset())
    return tables


async def load_publications(sql: SqlSession, names: list[str]) -> dict[str, Publication]:
    if not names:
        return {}
    gencols = "p.pubgencols = 's'" if await _publishes_generated(sql) else "false"
    rows = await sql.fetch(_PUBLICATIONS.format(gencols=gencols), list(names))
    tables: dict[str, dict] = {}
    for r in await sql.fetch(_PUBLICATION_RELS, list(names)):
        cols = tuple(r["cols"] or ()) if r["has_cols"] else None
        tables.setdefault(r["pubname"], {})[(r["nspname"], r["relname"])] = PubTable(
            where=r["qual"], columns=cols)
    return {r["pubname"]: Publication(
        name=r["pubname"], all_tables=r["puballtables"], insert=r["pubinsert"],
        update=r["pubupdate"], delete=r["pubdelete"], truncate=r["pubtruncate"],
        via_root=r["pubviaroot"], schemas=frozenset(r["schemas"]),
        tables=tables.get(r["pubname"], {}), generated_columns=r["gencols"]) for r in rows}


def route_publication_names(cfg: Config) -> list[str]:
    return sorted({p for r in cfg.routes for p in r.publication_names()})


async def load_catalog(sql: SqlSession, cfg: Config, *, strict: bool = True) -> Catalog:
    """Tables plus every publication the config names (the slot's and the routes'); with
    ``strict``, ``require_publications``."""
    names = sorted(set(route_publication_names(cfg)) | set(cfg.source.publications))
    pubs = await load_publications(sql, names)
    if strict:
        require_publications(cfg, pubs)
    return Catalog(publications=pubs, tables=await load_tables(sql))


def require_publications(cfg: Config, pubs) -> None:
    """A route publication not in ``pubs`` (a catalog's) is a ``PublicationMissing``."""
    if missing := [(i, r, names) for i, r in enumerate(cfg.routes)
                   if (names := [p for p in r.publication_names() if p not in pubs])]:
        raise PublicationMissing("; ".join(
            f"{_route_path(r, i)}: route {r.name!r} names publication(s) "
            f"{', '.join(repr(p) for p in names)}, which do not exist" for i, r, names in missing))


def build_route_specs(cfg: Config, catalog: Catalog | None, *,
                      skip_missing: bool = False) -> list[RouteSpec | None]:
    """One ``RouteSpec`` per ``[[routes]]``: publication routes and routes with a ``where``
    or ``columns`` get a planner; the rest keep the plain table/schema selectors. A route
    whose publication does not exist is a ``PublicationMissing`` naming both (with
    ``skip_missing``, its place holds None: callers that only look, such as ``check``'s
    topic plan, leave it to ``route_problems`` to report)."""
    filters = FilterCache()
    specs: list[RouteSpec | None] = []
    for i, r in enumerate(cfg.routes):
        ops = frozenset(r.operations)
        tables = frozenset(qualified(t) for t in r.tables)
        planner = None
        if r.publication_names():
            if catalog is None:
                raise PublicationMissing(f"route {r.name!r} needs the catalog")
            missing = [p for p in r.publication_names() if p not in catalog.publications]
            if missing and skip_missing:
                specs.append(None)
                continue
            if missing:
                raise PublicationMissing(
                    f"{_route_path(r, i)}: route {r.name!r} names publication(s) "
                    f"{', '.join(repr(p) for p in missing)}, which do not exist")
            pubs = [catalog.publications[p] for p in r.publication_names()]
            planner = Planner(r.name, publication_resolver(pubs, catalog), ops,
                              catalog.tables, filters)
        elif r.where or r.columns:
            planner = Planner(r.name, config_resolver(tables, r.where, r.columns), ops,
                              catalog.tables if catalog else {}, filters)
        specs.append(route_spec(r, i, tables=tables, ops=ops, planner=planner))
    return specs


def needs_catalog(cfg: Config) -> bool:
    return any(r.publication_names() or r.where or r.columns for r in cfg.routes)


def _route_resolver(route, catalog: Catalog):
    if route.publication_names():
        return publication_resolver([catalog.publications[p] for p in route.publication_names()],
                                    catalog)
    if route.tables:
        return config_resolver(frozenset(qualified(t) for t in route.tables), route.where,
                               route.columns)

    def by_selector(table, relation):
        if route.all_tables or any(fnmatch.fnmatchcase(table[0], p) for p in route.schemas):
            return Resolved(publish_as=table, insert=True, update=True, delete=True,
                            truncate=True)
        return None
    return by_selector


def _route_path(route, i: int) -> str:
    if route.publication:
        return f"routes[{i}].publication"
    if route.publications:
        return f"routes[{i}].publications"
    return f"routes[{i}].where" if route.where else f"routes[{i}]"


def route_problems(cfg: Config, catalog: Catalog) -> list[tuple[str, str]]:
    """``route_findings`` as (config key path, message)."""
    return [(path, message) for path, message, _ in route_findings(cfg, catalog)]


def route_findings(cfg: Config, catalog: Catalog, *,
                   missing_publications_warn: bool = False) -> list[tuple[str, str, bool]]:
    """What keeps routes from replicating exactly what their publications define, as
    (config key path, message, warning): filters or column lists that do not fit the table,
    UPDATE/DELETE without a usable replica identity or filtered on columns outside it, and
    the slot's own publications hiding rows, columns, actions or tables a route needs.

    Warnings are the replica-identity findings: PostgreSQL accepts such publications and
    refuses the UPDATE/DELETE statements themselves, so no change reaches the slot that the
    route would get wrong. Everything else would make a route miss or misroute changes, but
    a route publication missing now with ``missing_publications_warn`` (the router follows
    publications at their WAL position, so the backlog may still use it)."""
    problems: list[tuple[str, str, bool]] = []
    tables = catalog.tables
    slot_pubs = [catalog.publications[p] for p in cfg.source.publications
                 if p in catalog.publications]
    leaves = [t for t in tables.values() if t.relkind == "r"]
    for i, route in enumerate(cfg.routes):
        path = _route_path(route, i)
        missing = [p for p in route.publication_names() if p not in catalog.publications]
        if missing:
            problems.append((path, f"publication(s) {', '.join(missing)} do not exist",
                             missing_publications_warn))
            continue
        for j, t in enumerate(route.tables):
            if qualified(t) not in tables:
                problems.append((f"routes[{i}].tables[{j}]", f"table {t} does not exist", False))
        resolver, ops = _route_resolver(route, catalog), frozenset(route.operations)
        selector = not route.publication_names()
        for table in leaves:
            try:
                res = resolver(table.qualified, None)
            except ConfigError as exc:
                problems.append((path, str(exc), False))
                continue
            if res is None:
                continue
            name = f"{table.schema}.{table.name}"
            problems.extend((path, f"table {name}: {m}", warning)
                            for m, warning in _table_problems(table, res, ops, tables))
            problems.extend(("source.publications", f"route {route.name!r}, table {name}: {m}",
                             False) for m in _slot_problems(table, res, ops, slot_pubs,
                                                            tables, selector=selector))
    return problems


def routed_tables(cfg: Config, catalog: Catalog) -> list[set[tuple[str, str]]]:
    """Per route, the tables (by the name they are published as) it routes today: what its
    topics are made from."""
    return [set(published_as(route, catalog))
            if all(p in catalog.publications for p in route.publication_names()) else set()
            for route in cfg.routes]


def published_as(route, catalog: Catalog) -> list[tuple[str, str]]:
    """The names the tables ``route`` takes (its publications exist) are published as, once
    per table; one it cannot resolve is left out (route_problems reports it)."""
    resolver, out = _route_resolver(route, catalog), []
    for table in (t for t in catalog.tables.values() if t.relkind == "r"):
        try:
            res = resolver(table.qualified, None)
        except ConfigError:
            continue
        if res is not None:
            out.append(res.publish_as)
    return out


def _compiled(res: Resolved, info: TableInfo, action: str):
    sqls = getattr(res, f"{action}_filters") or ()
    ctypes = tuple(ColumnType(c.name, c.type_oid, c.type_modifier) for c in info.columns)
    return [compile_filter(s, ctypes) for s in sqls]


def _table_problems(table: TableInfo, res: Resolved, ops, tables) -> list[tuple[str, bool]]:
    """(message, warning) pairs."""
    out = []
    info = tables.get(res.publish_as, table)
    names = {c.name for c in info.columns}
    if res.columns is not None and res.columns - names:
        out.append((f"column list names unknown column(s) {sorted(res.columns - names)}",
                    False))
    keys = {c.name for c in info.columns if c.key}
    for action in ("update", "delete"):
        if not (getattr(res, action) and action in ops):
            continue
        if not keys and info.replica_identity != "f":
            out.append((f"publishes {action.upper()} but has no usable replica identity "
                        f"(REPLICA IDENTITY {'NOTHING' if info.replica_identity == 'n' else 'DEFAULT without a primary key'})",
                        True))
    for action in ("insert", "update", "delete"):
        if not (getattr(res, action) and action in ops):
            continue
        try:
            compiled = _compiled(res, info, action)
        except ConfigError as exc:
            out.append((f"row filter for {action.upper()}: {exc}", False))
            continue
        if action != "insert" and info.replica_identity != "f":
            outside = set().union(*(f.columns_used for f in compiled)) - keys if compiled else set()
            if outside:
                out.append((f"publishes {action.upper()} with a row filter on column(s) "
                            f"{sorted(outside)} outside the replica identity (PostgreSQL "
                            "refuses such UPDATE/DELETE; the old row only has key columns)",
                            True))
    return list(dict.fromkeys(out))


def _slot_problems(table: TableInfo, res: Resolved, ops, slot_pubs, tables, *,
                   selector: bool = False) -> list[str]:
    """``selector`` (a config route without ``columns``): needs no stored generated column."""
    try:
        slot = resolve(table, slot_pubs, tables)
    except ConfigError as exc:
        return [f"the slot's publications cannot be combined: {exc}"]
    if slot is None:
        return ["not in the slot's publications (source.publications)"]
    out = []
    if slot.publish_as != table.qualified and slot.publish_as != res.publish_as:
        out.append(f"the slot's publications send it as {'.'.join(slot.publish_as)} "
                   "(publish_via_partition_root), the route needs "
                   f"{'.'.join(res.publish_as)}")
    for action in ("insert", "update", "delete", "truncate"):
        if getattr(res, action) and action in ops and not getattr(slot, action):
            out.append(f"the slot's publications do not publish {action.upper()}")
        if action == "truncate":
            continue
        want = getattr(res, f"{action}_filters")
        have = getattr(slot, f"{action}_filters")
        if getattr(res, action) and action in ops and have is not None and (
                want is None or not set(want) <= set(have)):
            out.append(f"the slot's publications filter {action.upper()} with "
                       f"{' OR '.join(have)}, narrower than the route's "
                       f"{' OR '.join(want) if want else '(no filter)'}")
    if slot.columns is not None:
        info = tables.get(res.publish_as, table)
        needed = res.columns if res.columns is not None else {
            c.name for c in info.columns if not (selector and c.generated)}  # as sent
        for action in ("insert", "update", "delete"):
            try:
                needed = needed | set().union(*(f.columns_used
                                                 for f in _compiled(res, info, action)))
            except ConfigError:
                pass
        if needed - slot.columns:
            out.append(f"the slot's publications send only columns {sorted(slot.columns)}; "
                       f"the route needs {sorted(needed - slot.columns)} too")
    return out
