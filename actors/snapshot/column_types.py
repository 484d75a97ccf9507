"""The names of column types as the stream names them, for rows read by SQL.

Rules:

* Each type is named as pgoutput's Type message names it (``logicalrep_write_typ``): a
  domain by its base type (through every level of domains), anything else by itself;
  ``pg_catalog`` types by their bare name, others qualified by their schema.
* A table's snapshot, backfill and verify rows are typed with these names, so they share
  the stream's record schema.
"""

from __future__ import annotations

from ..services.sql import SqlSession
from .tables import SnapshotTable

#: each type as pgoutput's Type message names it (``logicalrep_write_typ``): a domain by its
#: base type (through every level of domains), anything else by itself
_TYPE_NAMES = """with recursive d(oid, base) as (
    select t.oid, t.oid from pg_type t where t.oid = any($1::oid[])
    union all
    select d.oid, t.typbasetype from d join pg_type t on t.oid = d.base where t.typtype = 'd')
select d.oid::int8 as oid, n.nspname, b.typname from d
join pg_type b on b.oid = d.base join pg_namespace n on n.oid = b.typnamespace
where b.typtype <> 'd'"""


async def type_names(sql: SqlSession, tables: list[SnapshotTable]) -> dict[int, str]:
    """Names of the column types as the stream's Type messages give them, so a table's
    snapshot, backfill and verify rows share the stream's schema (a domain column is typed
    as its base type on every path)."""
    oids = sorted({c.type_oid for t in tables for c in t.relation.columns})
    names = {}
    for r in await sql.fetch(_TYPE_NAMES, oids):
        names[r["oid"]] = r["typname"] if r["nspname"] == "pg_catalog" else \
            f"{r['nspname']}.{r['typname']}"
    return names
