"""Publication and table definitions read from PostgreSQL's catalog, and the route specs
built from them.

Rules:

* Read once at startup and again on SIGHUP (``Supervisor``); the core never queries. What is
  read is the *current* catalog, not the historic snapshot pgoutput decodes with: a changed
  publication applies from the next transaction the router sees after the reload.
* Tables: every ordinary and partitioned table outside the system schemas, with live,
  non-generated columns in attnum order (what a Relation message lists), the replica
  identity key (``relreplident``: primary key for DEFAULT, the ``indisreplident`` index for
  USING INDEX, every column for FULL, none for NOTHING), partition ancestors
  (``pg_inherits``, parent first) and leaf partitions.
* Publications: ``pg_publication`` (actions, ``puballtables``, ``pubviaroot``),
  ``pg_publication_namespace`` (TABLES IN SCHEMA) and ``pg_publication_rel`` with the row
  filter as ``pg_get_expr(prqual, prrelid)`` prints it and the column list as names.
"""

from __future__ import annotations

import fnmatch

from router.config import Config, qualified
from router.errors import PublicationMissing
from router.publications import (Catalog, CatalogColumn, FilterCache, Planner, PubTable,
                                 Publication, TableInfo, config_resolver, publication_resolver)
from router.routing import RouteSpec

from .pg import SqlSession

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

_COLUMNS = f"""
select a.attrelid, a.attnum, a.attname, a.atttypid::int8 as typid, a.atttypmod
from pg_attribute a join pg_class c on c.oid = a.attrelid
join pg_namespace n on n.oid = c.relnamespace
where {_USER_TABLES} and a.attnum > 0 and not a.attisdropped and a.attgenerated = ''
order by a.attrelid, a.attnum
"""

_KEYS = """
select i.indrelid, i.indkey::int2[] as keys, i.indisprimary, i.indisreplident
from pg_index i where (i.indisprimary or i.indisreplident) and i.indisvalid
"""

_INHERITS = """
select i.inhrelid, i.inhparent from pg_inherits i
join pg_class p on p.oid = i.inhparent where p.relkind = 'p'
"""

_PUBLICATIONS = """
select p.oid, p.pubname, p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete,
       p.pubtruncate, p.pubviaroot,
       coalesce((select array_agg(n.nspname::text) from pg_publication_namespace pn
                 join pg_namespace n on n.oid = pn.pnnspid where pn.pnpubid = p.oid),
                '{}') as schemas
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


async def load_tables(sql: SqlSession) -> dict[tuple[str, str], TableInfo]:
    rels = {r["oid"]: r for r in await sql.fetch(_TABLES)}
    columns: dict[int, list] = {}
    for r in await sql.fetch(_COLUMNS):
        columns.setdefault(r["attrelid"], []).append(r)
    pk: dict[int, set] = {}
    ri: dict[int, set] = {}
    for r in await sql.fetch(_KEYS):
        if r["indisprimary"]:
            pk[r["indrelid"]] = set(r["keys"])
        if r["indisreplident"]:
            ri[r["indrelid"]] = set(r["keys"])
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
                                   ident == "f" or c["attnum"] in keys)
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
    rows = await sql.fetch(_PUBLICATIONS, list(names))
    tables: dict[str, dict] = {}
    for r in await sql.fetch(_PUBLICATION_RELS, list(names)):
        cols = tuple(r["cols"] or ()) if r["has_cols"] else None
        tables.setdefault(r["pubname"], {})[(r["nspname"], r["relname"])] = PubTable(
            where=r["qual"], columns=cols)
    return {r["pubname"]: Publication(
        name=r["pubname"], all_tables=r["puballtables"], insert=r["pubinsert"],
        update=r["pubupdate"], delete=r["pubdelete"], truncate=r["pubtruncate"],
        via_root=r["pubviaroot"], schemas=frozenset(r["schemas"]),
        tables=tables.get(r["pubname"], {})) for r in rows}


def route_publication_names(cfg: Config) -> list[str]:
    return sorted({p for r in cfg.routes for p in r.publication_names()})


async def load_catalog(sql: SqlSession, cfg: Config, *, strict: bool = True) -> Catalog:
    """Tables plus every publication the config names (the slot's and the routes'). With
    ``strict`` a route publication that does not exist is a ``PublicationMissing``."""
    names = sorted(set(route_publication_names(cfg)) | set(cfg.source.publications))
    pubs = await load_publications(sql, names)
    if strict:
        missing = [p for p in route_publication_names(cfg) if p not in pubs]
        if missing:
            raise PublicationMissing(f"publication(s) {', '.join(missing)} named by routes do "
                                     "not exist")
    return Catalog(publications=pubs, tables=await load_tables(sql))


def build_route_specs(cfg: Config, catalog: Catalog | None) -> list[RouteSpec]:
    """One ``RouteSpec`` per ``[[routes]]``: publication routes and routes with a ``where``
    or ``columns`` get a planner; the rest keep the plain table/schema selectors."""
    filters = FilterCache()
    specs = []
    for r in cfg.routes:
        ops = frozenset(r.operations)
        tables = frozenset(qualified(t) for t in r.tables)
        planner = None
        if r.publication_names():
            if catalog is None:
                raise PublicationMissing(f"route {r.name!r} needs the catalog")
            pubs = [catalog.publications[p] for p in r.publication_names()]
            planner = Planner(r.name, publication_resolver(pubs, catalog), ops,
                              catalog.tables, filters)
        elif r.where or r.columns:
            planner = Planner(r.name, config_resolver(tables, r.where, r.columns), ops,
                              catalog.tables if catalog else {}, filters)
        specs.append(RouteSpec(name=r.name, tables=tables, schemas=frozenset(r.schemas),
                               all_tables=r.all_tables, operations=ops, topic=r.topic,
                               planner=planner))
    return specs


def schema_matches(patterns, schema: str) -> bool:
    return any(fnmatch.fnmatchcase(schema, p) for p in patterns)
