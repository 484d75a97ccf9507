"""Bucket digests in SQL (``router.verify_digest``'s rules, computed by PostgreSQL), for the
topics of JSON-format routes: only the rows of buckets whose digests differ from the folded
topic's are read and compared row by row.

Rules:

* One query per table (``GROUP BY`` bucket), in the verify snapshot's transaction, over the
  rows the route takes: the slot's filter and the route's own row filter in the ``WHERE``
  (the OR of its publications' filters, as the snapshot reads them; a config route's
  ``where``), the route's columns (its encoder's schema).
* Digests only ever save work: a bucket whose digests differ, for whatever reason (a filter
  or a text rendered differently), has its rows compared one by one, which is exact.
"""

from __future__ import annotations

from router.config import Config
from router.publications import resolve
from router.schema import TableSchema
from router.values import BPCHAR, FLOAT4, FLOAT8

from ..snapshot.tables import SnapshotTable, as_copied, ident


def _text(col) -> str:
    c = ident(col.name)
    if col.type_oid in (FLOAT4, FLOAT8):
        return (f"CASE WHEN {c}::text IN ('NaN', 'Infinity', '-Infinity') THEN {c}::text "
                f"ELSE encode(float8send({c}::text::float8), 'hex') END")
    if col.type_oid == BPCHAR:  # its cast to text trims the padding its output keeps
        return f"(CASE WHEN {c} IS NULL THEN NULL ELSE concat({c}) END)"
    return f"{c}::text"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def route_filter(cfg: Config, catalog, route: str, table: SnapshotTable) -> str | None:
    """The route's own row filter of ``table`` as SQL, as the snapshot reads it (None: none)."""
    r = next(x for x in cfg.routes if x.name == route)
    if r.publication_names():
        pubs = [as_copied(catalog.publications[p]) for p in r.publication_names()]
        res = resolve(catalog.tables[table.table], pubs, catalog.tables)
        filters = None if res is None else res.insert_filters
        return None if not filters else " OR ".join(f"({f})" for f in filters)
    return r.where or None


def _key(schema: TableSchema, by_name: dict) -> str:
    parts = []
    for name in sorted(schema.key_columns):
        t = _text(by_name[name])
        parts.append(f"coalesce(length({t})::text || ':' || {t}, '!')")
    return " || ',' || ".join(parts)


def _conds(table: SnapshotTable, where: str | None) -> list[str]:
    return [f"({w})" for w in (table.where, where) if w]


def _bucket(key: str, buckets: int) -> str:
    return f"(('x' || substr(md5({key}), 1, 7))::bit(28)::int % {int(buckets)})"


def sums_select(table: SnapshotTable, schema: TableSchema, where: str | None,
                buckets: int) -> str:
    """bucket, rows, digest sum (text) of the table's rows the route takes."""
    by_name = {c.name: c for c in schema.columns}
    key = _key(schema, by_name)
    cols = " + ".join(
        f"('x' || substr(md5(__k || {_literal('|' + c.name)} || coalesce(':' || {_text(c)}, "
        "'!')), 1, 15))::bit(60)::int8::numeric" for c in schema.columns)
    conds = _conds(table, where)
    src = f"ONLY {ident(table.table[0])}.{ident(table.table[1])}"
    inner = (f"SELECT {key} AS __k, * FROM {src}"
             + (f" WHERE {' AND '.join(conds)}" if conds else ""))
    return (f"SELECT {_bucket('__k', buckets)} AS b, count(*)::int8 AS n, "
            f"sum({cols})::text AS h FROM ({inner}) r GROUP BY 1")


def rows_select(table: SnapshotTable, schema: TableSchema, where: str | None,
                buckets: int) -> str:
    """The rows of the buckets ``$1`` (int[]), as ``SnapshotTable.select`` reads them."""
    by_name = {c.name: c for c in schema.columns}
    cols = ", ".join(ident(c.name) for c in table.relation.columns)
    conds = _conds(table, where) + [f"{_bucket(_key(schema, by_name), buckets)} = "
                                    "ANY($1::int[])"]
    return (f"SELECT {cols} FROM ONLY {ident(table.table[0])}.{ident(table.table[1])} "
            f"WHERE {' AND '.join(conds)}")


async def sql_sums(sql, table: SnapshotTable, schema: TableSchema, where: str | None,
                   buckets: int, into: dict[int, list]) -> None:
    """Adds the table's bucket sums to ``into`` (bucket -> [rows, sum])."""
    for r in await sql.fetch(sums_select(table, schema, where, buckets)):
        acc = into.setdefault(r["b"], [0, 0])
        acc[0] += r["n"]
        acc[1] += int(r["h"])


def differing(a: dict[int, list], b: dict[int, list]) -> set[int]:
    return {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
