"""The source side of the bucket digests (``router.verify.digests``'s rules): PostgreSQL renders
the columns' texts, the C accelerator digests them (``copy_sums``; the sub-buckets of a
bisect in SQL, ``sql_sums``), for the topics of JSON-format routes and of Connect and Avro
routes whose columns' types all render alike (``digestible``): only the rows of buckets whose
digests differ from the folded topic's are read and compared row by row.

Rules:

* One query per table (``GROUP BY`` bucket), in the verify snapshot's transaction, over the
  rows the route takes: the slot's filter and the route's own row filter in the ``WHERE``
  (the OR of its publications' filters, as the snapshot reads them; a config route's
  ``where``), the route's columns (its encoder's schema).
* Digests only ever save work: a bucket whose digests differ, for whatever reason (a filter
  or a text rendered differently), has its rows compared one by one, which is exact.
"""

from __future__ import annotations

import asyncpg
import msgspec

from router.config.router import Config
from router.errors import SourceError
from router.native import NATIVE
from router.routing.publications import resolve
from router.formats.schema import TableSchema
from router.formats.values import (BOOL, BPCHAR, FLOAT4, FLOAT8, INT2, INT4, INT8, INTERVAL, JSON,
                           JSONB, NAME, OID, TEXT, UUID, VARCHAR)
from router.verify.digests import acc_sums, copy_sums_py

from ..snapshot.tables import SnapshotTable, as_copied, ident


CIDR, INET, MACADDR = 650, 869, 829

#: types whose text the SQL side renders as the Connect and Avro formats' decoded values read
#: (PostgreSQL's text form, in a string; ints; booleans); floats apart (``_text``)
_PLAIN = frozenset({BOOL, INT2, INT4, INT8, OID, NAME, TEXT, VARCHAR, BPCHAR, JSON, JSONB,
                    UUID, INTERVAL, INET, CIDR, MACADDR})


def digestible(fmt: str, schema: TableSchema) -> bool:
    """Whether the SQL side renders every column of ``schema`` as the topic side reads the
    format's values: every column in the JSON format; in the Connect and Avro formats those
    of ``_PLAIN`` and floats (the others — numeric, dates and times, bytea, arrays, enums… —
    have their rows read one by one)."""
    return fmt == "json" or all(c.type_oid in _PLAIN or c.type_oid in (FLOAT4, FLOAT8)
                                for c in schema.columns)


#: types every format carries as a JSON number or boolean (not a string): their texts are
#: bare in the digests (``router.verify.digests``'s rules)
_BARE = frozenset({BOOL, INT2, INT4, INT8, OID, FLOAT4, FLOAT8})


def _kind(col) -> str:
    """``s``: the column's value is a JSON string (quoted in the digests), ``r``: a number
    or a boolean (its text bare; a float's ``#`` and hex, or its quoted ``NaN``)."""
    return "r" if col.type_oid in _BARE else "s"


def _text(col, fmt: str = "json") -> str:
    c = ident(col.name)
    if col.type_oid in (FLOAT4, FLOAT8):
        # the JSON format writes NaN and ±Infinity as strings (quoted: the text is bare),
        # Connect and Avro as null; Avro's float4 is a float32 (its float8 exactly), the
        # others the float8 of its text
        odd = f"'\"' || {c}::text || '\"'" if fmt == "json" else "NULL"
        value = f"{c}::float8" if fmt == "avro" and col.type_oid == FLOAT4 else f"{c}::text::float8"
        return (f"CASE WHEN {c}::text IN ('NaN', 'Infinity', '-Infinity') THEN {odd} "
                f"ELSE '#' || encode(float8send({value}), 'hex') END")
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


def _key(schema: TableSchema, by_name: dict, fmt: str) -> str:
    parts = []
    for name in sorted(schema.key_columns):
        t = _text(by_name[name], fmt)
        sep = ":" if _kind(by_name[name]) == "s" else "="
        parts.append(f"coalesce(length({t})::text || '{sep}' || {t}, '!')")
    return " || ',' || ".join(parts)


def _conds(table: SnapshotTable, where: str | None) -> list[str]:
    return [f"({w})" for w in (table.where, where) if w]


def _bucket(key: str, buckets: int) -> str:
    return f"(('x' || substr(md5({key}), 1, 7))::bit(28)::int % {int(buckets)})"


def _sub(key: str, subs: int) -> str:
    return f"(('x' || substr(md5({key}), 8, 7))::bit(28)::int % {int(subs)})"


def sums_select(table: SnapshotTable, schema: TableSchema, where: str | None,
                buckets: int, subs: int = 0, fmt: str = "json") -> str:
    """bucket, rows, digest sum (text) of the table's rows the route takes: one md5 a row
    (``router.verify.digests.row_digest``), over the columns' texts computed once. With
    ``subs``: of the rows of the buckets ``$1`` (int[]) by sub-bucket, ``b`` being
    ``bucket * subs + sub`` (``router.verify.digests.sub_sums``)."""
    by_name = {c.name: c for c in schema.columns}
    key = _key(schema, by_name, fmt)
    names = sorted(by_name)
    texts = ", ".join(f"{_text(by_name[n], fmt)} AS __c{i}" for i, n in enumerate(names))
    head = _literal(msgspec.json.encode(names).decode())
    row = "'[' || " + " || ',' || ".join(
        f"coalesce(to_json(__c{i})::text, 'null')" if _kind(by_name[n]) == "s"
        else f"coalesce(__c{i}, 'null')" for i, n in enumerate(names)) + " || ']'"
    conds = _conds(table, where)
    src = f"ONLY {ident(table.table[0])}.{ident(table.table[1])}"
    inner = (f"SELECT {key} AS __k, {texts} FROM {src}"
             + (f" WHERE {' AND '.join(conds)}" if conds else ""))
    digest = f"('x' || substr(md5(__k || {head} || {row}::text), 1, 15))::bit(60)::int8"
    group, only = _bucket("__k", buckets), ""
    if subs:
        only = f" WHERE {group} = ANY($1::int[])"
        group = f"({group}::int8 * {int(subs)} + {_sub('__k', subs)})"
    return (f"SELECT {group} AS b, count(*)::int8 AS n, "
            f"sum({digest})::text AS h FROM ({inner}) r{only} GROUP BY 1")


def rows_select(table: SnapshotTable, schema: TableSchema, where: str | None,
                buckets: int, subs: int = 0, fmt: str = "json") -> str:
    """The rows of the buckets ``$1`` (int[]) and, with ``subs``, of the sub-buckets ``$2``
    (int8[], ``bucket * subs + sub``), as ``SnapshotTable.select`` reads them."""
    by_name = {c.name: c for c in schema.columns}
    cols = ", ".join(ident(c.name) for c in table.relation.columns)
    key = _key(schema, by_name, fmt)
    which = f"{_bucket(key, buckets)} = ANY($1::int[])"
    if subs:
        which = (f"({which} OR ({_bucket(key, buckets)}::int8 * {int(subs)} + "
                 f"{_sub(key, subs)}) = ANY($2::int8[]))")
    conds = _conds(table, where) + [which]
    return (f"SELECT {cols} FROM ONLY {ident(table.table[0])}.{ident(table.table[1])} "
            f"WHERE {' AND '.join(conds)}")


def texts_select(table: SnapshotTable, schema: TableSchema, where: str | None,
                 fmt: str = "json") -> tuple[str, tuple[int, ...], bytes, bytes]:
    """The SELECT of the texts of the columns (sorted by name) of the table's rows the route
    takes, the indexes of the key's among them, the names' JSON and the columns' kinds
    (``_kind``, a byte each: ``copy_sums``)."""
    by_name = {c.name: c for c in schema.columns}
    names = sorted(by_name)
    conds = _conds(table, where)
    select = (f"SELECT {', '.join(_text(by_name[n], fmt) for n in names)} FROM ONLY "
              f"{ident(table.table[0])}.{ident(table.table[1])}"
              + (f" WHERE {' AND '.join(conds)}" if conds else ""))
    keys = tuple(names.index(k) for k in sorted(schema.key_columns))
    kinds = "".join(_kind(by_name[n]) for n in names).encode()
    return select, keys, msgspec.json.encode(names), kinds


#: COPY data handed to the digests at a time
COPY_CHUNK = 1 << 20


async def copy_sums(sql, table: SnapshotTable, schema: TableSchema, where: str | None,
                    buckets: int, into: dict[int, list], fmt: str = "json") -> None:
    """Adds the table's bucket sums to ``into`` (bucket -> [rows, sum]): PostgreSQL renders
    the columns' texts (``COPY``), the C accelerator digests them without the GIL
    (``router._native.verify_copy``; ``router.verify.digests.copy_sums_py`` without it), so
    the topic's fold runs meanwhile."""
    select, keys, head, kinds = texts_select(table, schema, where, fmt)
    acc = bytearray(buckets * 24)
    digest = getattr(NATIVE, "verify_copy", None) or copy_sums_py
    state = {"rest": b"", "parts": [], "size": 0}

    def take(final: bool = False) -> None:
        data = b"".join([state["rest"], *state["parts"]])
        end = len(data) if final else data.rfind(b"\n") + 1
        state["rest"], state["parts"], state["size"] = data[end:], [], 0
        if end:
            digest(data[:end], keys, kinds, head, buckets, acc)

    async def sink(data: bytes) -> None:
        state["parts"].append(data)
        state["size"] += len(data)
        if state["size"] >= COPY_CHUNK:
            take()

    try:
        await sql.copy_out(select, sink=sink)
        take(final=True)
    except asyncpg.PostgresError as exc:
        raise SourceError(f"verify: reading the digests of {table.name} failed: "
                          f"{exc}") from exc
    except ValueError as exc:  # a line the digests cannot take apart
        raise SourceError(f"verify: the COPY rows of {table.name}: {exc}") from exc
    acc_sums(acc, into)


async def sql_sums(sql, table: SnapshotTable, schema: TableSchema, where: str | None,
                   buckets: int, into: dict[int, list], subs: int = 0,
                   split: list[int] | None = None, fmt: str = "json") -> None:
    """Adds the table's bucket sums to ``into`` (bucket -> [rows, sum]; with ``subs``, of
    the buckets ``split`` by sub-bucket)."""
    args = (split,) if subs else ()
    for r in await sql.fetch(sums_select(table, schema, where, buckets, subs, fmt), *args):
        acc = into.setdefault(r["b"], [0, 0])
        acc[0] += r["n"]
        acc[1] += int(r["h"])
