"""Table schemas as they travel through Kafka, so consumers never connect to PostgreSQL.

Rules:

* A ``TableSchema`` describes the columns a route publishes for one table: names, PostgreSQL
  type (internal name, OID, type modifier, numeric precision/scale, array element type) and
  which columns form the replica-identity key. It is derived from the Relation message in
  effect (and the route's column list), never from a catalog query.
* ``schema_id`` is a content hash: the same layout always gets the same id, a changed layout
  (added/dropped column, new type or modifier, key change) a new one. Data records name it in
  ``source.schema_id``.
* Schema records go to one compacted topic (``[kafka] schema_topic``), keyed by ``schema_id``;
  the sink has each new schema acknowledged by Kafka before it sends a record naming it, so a
  consumer that reads a data record can always find its schema.
"""

from __future__ import annotations

import hashlib

import msgspec

from ..pgoutput import Relation
from ..postgres.type_names import BUILTIN_TYPES
from .values import NUMERIC, BPCHAR, VARCHAR, TIME, TIMESTAMP, TIMESTAMPTZ

SCHEMA_FORMAT = 1
_VARHDRSZ = 4


class ColumnSchema(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    type: str  # internal name: int4, numeric, timestamptz, _int4 (array of int4), my_enum…
    type_oid: int
    type_modifier: int = -1
    key: bool = False
    precision: int | None = None  # numeric(p,s); varchar/bpchar length; time precision
    scale: int | None = None
    element: str | None = None  # element type of an array (`int4` for `_int4`)


class TableSchema(msgspec.Struct, frozen=True):
    schema_id: str
    schema: str
    table: str
    columns: tuple[ColumnSchema, ...]
    key_columns: tuple[str, ...]
    replica_identity: str
    format: int = SCHEMA_FORMAT


def _modifiers(type_oid: int, typmod: int) -> tuple[int | None, int | None]:
    if typmod < 0:
        return None, None
    if type_oid == NUMERIC and typmod >= _VARHDRSZ:
        raw = typmod - _VARHDRSZ
        scale = raw & 0x7FF
        if scale & 0x400:  # PG 15 allows negative scales, stored as 11-bit two's complement
            scale -= 0x800
        return (raw >> 16) & 0xFFFF, scale
    if type_oid in (VARCHAR, BPCHAR) and typmod >= _VARHDRSZ:
        return typmod - _VARHDRSZ, None
    if type_oid in (TIME, TIMESTAMP, TIMESTAMPTZ):
        return typmod, None
    return None, None


_ELEMENTS = {"numeric": NUMERIC, "varchar": VARCHAR, "bpchar": BPCHAR, "time": TIME,
             "timestamp": TIMESTAMP, "timestamptz": TIMESTAMPTZ}


def element_modifiers(col: ColumnSchema) -> tuple[int | None, int | None]:
    """(precision, scale) of an array column's elements: the column's type modifier is
    theirs (``numeric(6,2)[]``, ``timestamp(3)[]``). Kept out of ``ColumnSchema`` so the
    layouts published before keep their ``schema_id``."""
    oid = _ELEMENTS.get(col.element or "")
    return (None, None) if oid is None else _modifiers(oid, col.type_modifier)


def column_schema(name: str, type_oid: int, typmod: int, key: bool,
                  type_names: dict[int, str] | None = None) -> ColumnSchema:
    tname = (type_names or {}).get(type_oid) or BUILTIN_TYPES.get(type_oid) or f"oid:{type_oid}"
    precision, scale = _modifiers(type_oid, typmod)
    element = tname[1:] if tname.startswith("_") else None
    return ColumnSchema(name=name, type=tname, type_oid=type_oid, type_modifier=typmod, key=key,
                        precision=precision, scale=scale, element=element)


def table_schema(relation: Relation, column_indexes: tuple[int, ...] | None = None,
                 type_names: dict[int, str] | None = None) -> TableSchema:
    """The schema of ``relation`` as published (only ``column_indexes`` when a column list
    projects it)."""
    cols = relation.columns
    picked = range(len(cols)) if column_indexes is None else column_indexes
    columns = tuple(column_schema(cols[i].name, cols[i].type_oid, cols[i].type_modifier,
                                  bool(cols[i].flags & 1), type_names) for i in picked)
    key_columns = tuple(c.name for c in columns if c.key)
    body = msgspec.json.encode([relation.namespace, relation.name, columns, key_columns,
                                relation.replica_identity, SCHEMA_FORMAT])
    schema_id = hashlib.sha256(body).hexdigest()[:16]
    return TableSchema(schema_id=schema_id, schema=relation.namespace, table=relation.name,
                       columns=columns, key_columns=key_columns,
                       replica_identity=relation.replica_identity)


def encode_schema(schema: TableSchema) -> tuple[bytes, bytes]:
    """(key, value) of the schema topic record."""
    return schema.schema_id.encode(), msgspec.json.encode(schema)


def decode_schema(value: bytes) -> TableSchema:
    return msgspec.json.decode(value, type=TableSchema)
