"""Kafka Connect records (``[kafka] format = "connect"``): the Debezium envelope with a
Kafka Connect JSON schema, as Debezium's ``JsonConverter`` (``schemas.enable=true``) writes
it, so Kafka Connect sink connectors consume pgrouter's topics as they are.

Rules:

* key and value are ``{"schema": …, "payload": …}``. The key schema is a struct of the key
  columns (``<topic-prefix>.<schema>.<table>.Key``); the value schema is Debezium's envelope
  (``….Envelope``: ``before``/``after`` of the row struct ``….Value``, ``source``, ``op``,
  ``ts_ms``), plus ``unchanged_toast`` (optional array of strings).
* Column types map as Debezium's PostgreSQL connector maps them with
  ``decimal.handling.mode=precise``, ``time.precision.mode=adaptive`` (the defaults) and
  ``binary.handling.mode=bytes``; ``docs/record-formats.md`` has the table. Arrays of every
  built-in type map their elements; a multi-dimensional array whose elements are not
  strings has no Connect form and stops the router with ``RecordUnencodable``.
* An unchanged TOAST value is Debezium's placeholder ``__debezium_unavailable_value`` in
  string-like columns (bytes: the placeholder's UTF-8 bytes, base64), null otherwise, and
  the column is named in ``unchanged_toast``.
* Dates and timestamps cover PostgreSQL's whole range (BC, years past 9999:
  ``router.postgres.datetimes``); a value Connect's type cannot hold (``infinity``, a timestamp past
  int64 µs) is null. Array elements take the column's modifiers (``numeric(6,2)[]``,
  ``timestamp(3)[]``), as Debezium maps them. A domain is its base type (the stream's Type
  message names it so, and the snapshot resolves it alike); its value arrives as text.
* An update that changes the key is written as Debezium writes it: a delete of the old key
  and a create of the new one, both at the update's position (delete first).
* Records without a table schema (logical decoding messages, transaction metadata) are left
  as they are.
* The conversion works on the JSON record pgrouter already encoded and the ``TableSchema``
  the router published for it (``source.schema_id``): types come from the relation, never
  from a catalog query.
"""

from __future__ import annotations

import base64

import msgspec

from . import connect_values as values
from .connect_values import PLACEHOLDER, array_values, micro_time, milli_time
from ..errors import InternalError, RecordUnencodable
from ..postgres.datetimes import iso_utc, micros
from .schema import ColumnSchema, TableSchema, element_modifiers
from .tombstones import Preceding

_decode = msgspec.json.decode
_encode = msgspec.json.Encoder(decimal_format="number").encode


def unencodable(table: str, col: ColumnSchema, value, what: str, whose: str) -> str:
    """The line for a value a record format cannot hold (``RecordUnencodable``)."""
    text = str(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    why = (f" (a multi-dimensional array: {whose} arrays have one element type)"
           if col.element is not None and "{{" in str(value) else "")
    return (f"{table}: column {col.name!r} ({col.type}) value {text!r} cannot be written "
            f"as {what}{why}; format = \"json\" carries it as text")


# -- value conversions (PostgreSQL text form or JSON value → Connect payload) ---------------

def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _decimal(scale: int):
    def convert(v: str) -> str | None:
        raw = values.unscaled(v, scale)
        return None if raw is None else _b64(raw)
    return convert


def _variable_decimal(v: str):
    vsd = values.variable_decimal(v)
    return None if vsd is None else {"scale": vsd[0], "value": _b64(vsd[1])}


def _bytes(v: str):
    return _b64(values.bytea(v))


_date = values.date
_micro_timestamp = values.timestamp(False, False)
_milli_timestamp = values.timestamp(False, True)


def _zoned_timestamp(v: str):
    # "2024-01-02 03:04:05.123+00" → "2024-01-02T03:04:05.123000Z" (Debezium: ISO-8601, UTC)
    m = micros(v, True)
    return None if m is None else iso_utc(m)


def _number(v):
    # "NaN"/"Infinity" are not JSON numbers; a domain's value arrives as its text
    return v if not isinstance(v, str) else values.float_text(v)


def _same(v):
    return v


def _integer(v):
    return int(v) if isinstance(v, str) else v  # a domain over an integer: its text


def _boolean(v):
    return v == "t" if isinstance(v, str) else v


_FROM_TEXT = {"int16": int, "int32": int, "int64": int, "float": values.float_text,
              "double": values.float_text, "boolean": lambda v: v == "t"}


_INT = {"int2": "int16", "int4": "int32", "int8": "int64", "oid": "int64"}
_STRINGS = {"text", "varchar", "bpchar", "char", "name", "xml", "inet", "cidr", "macaddr",
            "bit", "varbit", "tsvector", "money", "interval", "pg_lsn", "xid", "xid8",
            "int4range", "int8range", "numrange", "tsrange", "tstzrange", "daterange"}
_NAMED = {"uuid": "io.debezium.data.Uuid", "json": "io.debezium.data.Json",
          "jsonb": "io.debezium.data.Json", "timetz": "io.debezium.time.ZonedTime"}

def _column_type(type_name: str, precision: int | None, scale: int | None):
    """(schema without field/optional, converter) of one PostgreSQL type."""
    if type_name == "bool":
        return {"type": "boolean"}, _boolean
    if type_name in _INT:
        return {"type": _INT[type_name]}, _integer
    if type_name in ("float4", "float8"):
        return {"type": "float" if type_name == "float4" else "double"}, _number
    if type_name == "numeric":
        if scale is not None:
            params = {"scale": str(scale)}
            if precision:
                params["connect.decimal.precision"] = str(precision)
            return ({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                     "version": 1, "parameters": params}, _decimal(scale))
        return ({"type": "struct", "name": "io.debezium.data.VariableScaleDecimal",
                 "version": 1, "fields": [{"type": "int32", "optional": False, "field": "scale"},
                                          {"type": "bytes", "optional": False,
                                           "field": "value"}]}, _variable_decimal)
    if type_name == "bytea":
        return {"type": "bytes"}, _bytes
    if type_name == "date":
        return {"type": "int32", "name": "io.debezium.time.Date", "version": 1}, _date
    if type_name == "timestamp":
        if precision is not None and precision <= 3:
            return ({"type": "int64", "name": "io.debezium.time.Timestamp", "version": 1},
                    _milli_timestamp)
        return ({"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1},
                _micro_timestamp)
    if type_name == "timestamptz":
        return ({"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1},
                _zoned_timestamp)
    if type_name == "time":
        if precision is not None and precision <= 3:
            return {"type": "int32", "name": "io.debezium.time.Time", "version": 1}, milli_time
        return ({"type": "int64", "name": "io.debezium.time.MicroTime", "version": 1},
                micro_time)
    if type_name in _NAMED:
        return {"type": "string", "name": _NAMED[type_name], "version": 1}, _same
    return {"type": "string"}, _same  # text-like, enums, domains, everything else


def column(col: ColumnSchema):
    """(field schema, converter) of a column; arrays map their elements."""
    if col.element is not None:
        # the column's modifiers are its elements' (numeric(6,2)[], timestamp(3)[]), as
        # Debezium reads them
        item, conv = _column_type(col.element, *element_modifiers(col))
        item = dict(item, optional=True)
        if "name" not in item:  # plain numbers and booleans: elements arrive as text
            conv = _FROM_TEXT.get(item["type"], conv)  # (logical types convert from text)

        nested_ok = item["type"] == "string"  # inner arrays of a string array stay text

        def array(v):
            return None if v is None else array_values(v, conv, nested_ok)
        return {"type": "array", "items": item, "optional": True, "field": col.name}, array
    schema, conv = _column_type(col.type, col.precision, col.scale)
    return dict(schema, optional=True, field=col.name), conv


_SOURCE_FIELDS = [("db", "string", False), ("schema", "string", False),
                  ("table", "string", False), ("lsn", "int64", True),
                  ("commit_lsn", "int64", True), ("seq", "int64", True), ("xid", "int64", True),
                  ("commit_time", "string", True), ("origin", "string", True),
                  ("origin_lsn", "int64", True), ("route", "string", True),
                  ("schema_id", "string", True)]
_SOURCE_SCHEMA = {"type": "struct", "name": "io.pgrouter.Source", "optional": False,
                  "field": "source",
                  "fields": [{"type": t, "optional": o, "field": f} for f, t, o in _SOURCE_FIELDS]}
_STRING_LIKE = frozenset({"string"})


class _Table:
    """Schemas and converters of one table layout (one ``schema_id``)."""

    def __init__(self, schema: TableSchema, topic: str):
        name = f"{topic}"
        fields, self.convs = [], {}
        self.placeholders = {}
        self.table = f"{schema.schema}.{schema.table}"
        self.columns = {c.name: c for c in schema.columns}
        for col in schema.columns:
            field, conv = column(col)
            fields.append(field)
            self.convs[col.name] = conv
            kind = field["type"]
            self.placeholders[col.name] = (PLACEHOLDER if kind in _STRING_LIKE else
                                           base64.b64encode(PLACEHOLDER.encode()).decode()
                                           if kind == "bytes" and "name" not in field else None)
        row = {"type": "struct", "name": f"{name}.Value", "optional": True, "fields": fields}
        self.value_schema = {
            "type": "struct", "name": f"{name}.Envelope", "optional": False, "version": 1,
            "fields": [dict(row, field="before"), dict(row, field="after"), _SOURCE_SCHEMA,
                       {"type": "string", "optional": False, "field": "op"},
                       {"type": "int64", "optional": True, "field": "ts_ms"},
                       {"type": "array", "items": {"type": "string", "optional": False},
                        "optional": True, "field": "unchanged_toast"}]}
        by_name = {f["field"]: f for f in fields}
        self.key_names = schema.key_columns
        self.key_schema = {"type": "struct", "name": f"{name}.Key", "optional": False,
                           "fields": [dict(by_name[k], optional=False)
                                      for k in schema.key_columns]}

    def row(self, row: dict | None, toast: list | None = None) -> dict | None:
        if row is None:
            return None
        convs = self.convs
        out = {}
        for name, conv in convs.items():
            v = row.get(name)
            try:
                out[name] = None if v is None else conv(v)
            except (ValueError, TypeError, IndexError, OverflowError) as exc:
                raise RecordUnencodable(self._unencodable(name, v)) from exc
        for name in toast or ():
            out[name] = self.placeholders.get(name)
        return out

    def _unencodable(self, name: str, value) -> str:
        return unencodable(self.table, self.columns[name], value, "a Kafka Connect record",
                           "Connect's")

    def key(self, key: dict | None) -> dict | None:
        if key is None or not self.key_names:
            return None
        return {n: (None if key.get(n) is None else self.convs[n](key[n]))
                for n in self.key_names}


class ConnectFormat:
    """Turns pgrouter's JSON records into Connect JSON records. ``learn`` each published
    ``TableSchema`` before a record naming it is converted (the sink sees schemas first)."""

    def __init__(self):
        self._schemas: dict[str, TableSchema] = {}
        self._tables: dict[tuple[str, str], _Table] = {}

    def learn(self, schema: TableSchema) -> None:
        self._schemas[schema.schema_id] = schema

    def _table(self, schema_id: str, topic: str) -> _Table | None:
        table = self._tables.get((schema_id, topic))
        if table is None:
            schema = self._schemas.get(schema_id)
            if schema is None:
                return None
            table = self._tables[(schema_id, topic)] = _Table(schema, topic)
        return table

    def convert(self, record: tuple) -> tuple:
        topic, key, value, headers = record
        env = _decode(value)
        source = env.get("source") if isinstance(env, dict) else None
        schema_id = source.get("schema_id") if isinstance(source, dict) else None
        if not schema_id:
            return record
        table = self._table(schema_id, topic)
        if table is None:
            raise InternalError(f"record for {topic} names schema {schema_id}, which was not "
                                "published before it")
        toast = env.get("unchanged_toast")
        before, after = env.get("before"), env.get("after")
        op = env["op"]
        key_payload = table.key(_decode(key)) if key is not None else None
        if op == "u" and before is not None and table.key_names and any(
                before.get(k) != after.get(k) for k in table.key_names):
            # a key change is a delete of the old key and a create of the new one, as
            # Debezium writes it (a sink upserting by key would keep the old row otherwise)
            old_key = table.key(before)
            return [self._record(table, topic, old_key, table.row(before), None, source, "d",
                                 env, None, headers),
                    self._record(table, topic, key_payload, None, table.row(after, toast),
                                 source, "c", env, toast, headers)]
        return self._record(table, topic, key_payload, table.row(before),
                            table.row(after, toast), source, op, env, toast, headers)

    @staticmethod
    def _record(table, topic, key_payload, before, after, source, op, env, toast, headers):
        payload = {"before": before, "after": after, "source": source, "op": op,
                   "ts_ms": env.get("ts_ms"), "unchanged_toast": toast}
        new_value = _encode({"schema": table.value_schema, "payload": payload})
        new_key = (None if key_payload is None else
                   _encode({"schema": table.key_schema, "payload": key_payload}))
        return (topic, new_key, new_value, headers)

    def _tombstone_key(self, schema_id: str, topic: str, key: dict) -> bytes:
        """A tombstone's key (``router.formats.tombstones``) in the Connect JSON of its table."""
        table = self._table(schema_id, topic)
        if table is None:
            raise InternalError(f"tombstone for {topic} follows a record of a schema that "
                                "was not published before it")
        return _encode({"schema": table.key_schema, "payload": table.key(key)})

    def convert_all(self, records: list) -> list:
        """Every record converted; a key change becomes two records (delete, create)."""
        out = []
        convert = self.convert
        preceding = None
        for record in records:
            if record[2] is None:  # a tombstone (router.formats.tombstones): its key reshaped
                if preceding is None:
                    preceding = Preceding(records, self._tombstone_key)
                out.append(preceding.reshape(record))
                continue
            converted = convert(record)
            if type(converted) is list:
                out.extend(converted)
            else:
                out.append(converted)
        return out
