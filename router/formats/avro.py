"""Avro records with a schema registry (``[kafka] format = "avro"``): the Debezium envelope as
Debezium's connector writes it through Confluent's (or Apicurio's) ``AvroConverter``, in the
Confluent wire format, so registry-aware consumers (Kafka Connect sinks, ksqlDB, Flink,
Spark's ``from_avro``, confluent-kafka's ``AvroDeserializer``) read pgrouter's topics as they
are.

Rules:

* A record's key and value are ``0x00``, the schema's registry id (4 bytes, big-endian) and
  the Avro binary encoding of the datum (the Confluent wire format).
* The value schema is the record ``Envelope`` (namespace: the topic, made a valid Avro name)
  with ``before`` and ``after`` (the optional row record ``Value``), ``source`` (the record
  ``io.pgrouter.Source``: the JSON envelope's source fields), ``op``, ``ts_ms``,
  ``unchanged_toast`` (optional array of column names), ``truncate`` (optional record of
  a truncate's options) and ``key_change`` (optional string). The key schema is the record ``Key`` of the key columns; a table
  without key columns writes a null key.
* Every column is an optional field (``["null", T]``, default null), as Debezium writes
  them. A column name that is not a valid Avro name is written with ``_`` for each other
  character (``_`` before a leading digit; ``_2`` … when that clashes) and the field names
  the column in its ``pgrouter.column`` property. Types follow the Kafka Connect format's mapping (``router.formats.connect``), written
  as Confluent's ``AvroData`` writes Connect schemas (``connect.name``,
  ``connect.parameters``, ``connect.type`` properties), with Avro's logical types where one
  fits: numeric(p,s) → ``bytes`` ``decimal`` (precision p, scale s; a negative scale is
  scale 0 with precision p−s), unconstrained numeric → Debezium's ``VariableScaleDecimal``
  record, numeric NaN/±Infinity → null; timestamp → ``long`` ``local-timestamp-micros``
  (``-millis`` for precision ≤ 3), timestamptz → ``long`` ``timestamp-micros`` (UTC),
  date → ``int`` ``date``, time → ``long`` ``time-micros`` (``int`` ``time-millis`` for
  precision ≤ 3), uuid → ``string`` ``uuid``, bytea → ``bytes``; dates and timestamps over
  PostgreSQL's whole range (BC, years past 9999), ``infinity`` and a timestamp past
  ``long`` µs → null; arrays → Avro arrays of optional elements with the column's
  modifiers (``numeric(6,2)[]``: ``decimal(6,2)`` items); a domain → its base type (as
  pgoutput names it, on every path); json, jsonb, timetz, interval, enums, composite values
  and every other type → their PostgreSQL text form as ``string``. ``docs/record-formats.md`` has the table.
* A logical type AvroData reads as Kafka Connect's own (``date``, ``time-millis``,
  ``timestamp-millis``: Connect's Date, Time, Timestamp) carries Connect's ``connect.name``,
  as AvroData writes it: with Debezium's name there AvroData refuses the schema ("Mismatched
  names"). The other logical types are plain ints and longs to AvroData and keep Debezium's.
* An unchanged TOAST value is Debezium's placeholder ``__debezium_unavailable_value`` in
  string columns (bytes columns: its UTF-8 bytes), null otherwise, and the column is named in
  ``unchanged_toast``.
* An update that changes the key is a delete of the old key and a create of the new one,
  both at the update's position (as the Connect format and Debezium write it); the pair is
  marked in ``key_change`` (``delete_old``, ``create_new``; null on every other record) and
  the create keeps the old row in ``before``, so a reader can make the update of it again
  (``router.formats.avro_read``, for ``pgrouter apply``).
* Logical decoding messages (``op: m``) have their own fixed schema ``io.pgrouter.Message``.
  Transaction metadata records (``router.routing.transaction_meta``) stay JSON, as pgrouter's own
  topics do.
* Subjects: ``<topic>-key`` / ``<topic>-value`` (``topic``, the default),
  ``<record full name>`` (``record``) or ``<topic>-<record full name>`` (``topic_record``).
  Ids come from the registry; ``AvroFormat`` asks for each (subject, schema) once and keeps
  the id (``SchemasNeeded`` lists the ones it does not know yet; the caller registers them
  and converts again). This module does no I/O.
* The conversion works on the JSON record pgrouter already encoded and the ``TableSchema``
  the router published for it (``source.schema_id``).
* With the C accelerator (``router.native``), ``router._native.AvroConverter`` converts the
  plain records, byte for byte as ``_convert_all_py`` does, from a plan of each table layout
  on each topic (``_Table.native_plan``) once its ids are known; what it declines (a table's
  first record, key changes, messages, values not in PostgreSQL's plain text forms...) is
  converted here.
"""

from __future__ import annotations

import base64
import re

import msgspec

from .avro_envelope import (MESSAGE_SCHEMA, _envelope_fields, _field, _write_opt_long,
                            _write_opt_string, _write_source, _write_toast, _write_truncate)
from .avro_types import _long_bytes, _optional, _w_bytes, _w_string, column_type
from .connect import unencodable
from ..errors import InternalError, RecordUnencodable
from ..native import NATIVE
from .schema import TableSchema
from .tombstones import Preceding

NAMING = ("topic", "record", "topic_record")
MAGIC = b"\x00"
_decode = msgspec.json.decode
_schema_json = msgspec.json.Encoder().encode


# -- schemas ----------------------------------------------------------------------------------

_NAME_OK = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def avro_namespace(topic: str) -> str:
    """``topic`` as an Avro namespace: each dot-separated part a valid name (other characters
    become ``_``; a part starting with a digit gets a leading ``_``)."""
    parts = []
    for part in topic.split("."):
        part = re.sub(r"[^A-Za-z0-9_]", "_", part) or "_"
        parts.append(part if _NAME_OK.match(part) else "_" + part)
    return ".".join(parts)


#: field property naming the PostgreSQL column of a field whose name had to change
COLUMN_PROP = "pgrouter.column"


def field_names(columns: list[str]) -> dict[str, str]:
    """column -> its Avro field name: the column's name where it is a valid Avro name, else
    with every other character ``_`` (a leading digit gets a leading ``_``), made unique
    with ``_2``, ``_3`` …"""
    out, taken = {}, set()
    valid = [c for c in columns if _NAME_OK.match(c)]
    taken.update(valid)
    for c in columns:
        if c in out:
            continue
        if _NAME_OK.match(c):
            out[c] = c
            continue
        base = re.sub(r"[^A-Za-z0-9_]", "_", c) or "_"
        base = base if _NAME_OK.match(base) else "_" + base
        name, n = base, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        out[c] = name
    return out


class Subject(msgspec.Struct, frozen=True):
    """One schema to register: where (``subject``), what (``schema``, Avro JSON text), and
    for error lines which table and topic it serves."""

    subject: str
    schema: str
    topic: str
    table: str = ""
    kind: str = "value"  # key | value
    columns: tuple = ()  # (name, PostgreSQL type) of the table layout


class SchemasNeeded(Exception):
    """``convert`` met schemas without a registry id: register ``subjects``, ``set_id`` each,
    and convert again."""

    def __init__(self, subjects: list[Subject]):
        super().__init__(f"{len(subjects)} schema(s) to register")
        self.subjects = subjects


def subject_name(naming: str, topic: str, kind: str, full_name: str) -> str:
    if naming == "record":
        return full_name
    if naming == "topic_record":
        return f"{topic}-{full_name}"
    return f"{topic}-{kind}"


class _Table:
    """Schemas, converters and writers of one table layout (``schema_id``) on one topic."""

    def __init__(self, schema: TableSchema, topic: str, naming: str):
        ns = avro_namespace(topic)
        self.table = f"{schema.schema}.{schema.table}"
        self.columns = {c.name: c for c in schema.columns}
        self.field_names = field_names([c.name for c in schema.columns])
        defined: set = set()
        fields, self.convs, self.writers, self.placeholders = [], [], [], {}
        self._natives = []
        for col in schema.columns:
            t = column_type(col, defined)
            fields.append(_field(self.field_names[col.name], t.schema, True))
            if self.field_names[col.name] != col.name:
                fields[-1][COLUMN_PROP] = col.name
            self.convs.append((col.name, t.convert))
            self.writers.append(_optional(t.write))
            self.placeholders[col.name] = t.placeholder
            self._natives.append(t.native)
        row = {"type": "record", "name": "Value", "namespace": ns, "fields": fields,
               "connect.name": f"{ns}.Value"}
        self.value_schema = {"type": "record", "name": "Envelope", "namespace": ns,
                             "fields": _envelope_fields(row, ns),
                             "connect.name": f"{ns}.Envelope", "connect.version": 1}
        self.key_names = tuple(schema.key_columns)
        key_defined: set = set()
        key_fields, self.key_convs, self.key_writers = [], [], []
        for name in self.key_names:
            t = column_type(self.columns[name], key_defined)
            key_fields.append(_field(self.field_names[name], t.schema, False))
            if self.field_names[name] != name:
                key_fields[-1][COLUMN_PROP] = name
            self.key_convs.append((name, t.convert))
            self.key_writers.append(t.write)
        self.key_schema = ({"type": "record", "name": "Key", "namespace": ns,
                            "fields": key_fields, "connect.name": f"{ns}.Key"}
                           if self.key_names else None)
        cols = tuple((c.name, c.type) for c in schema.columns)
        self.value_subject = Subject(subject_name(naming, topic, "value", f"{ns}.Envelope"),
                                     _schema_json(self.value_schema).decode(), topic,
                                     self.table, "value", cols)
        self.key_subject = (None if self.key_schema is None else Subject(
            subject_name(naming, topic, "key", f"{ns}.Key"),
            _schema_json(self.key_schema).decode(), topic, self.table, "key", cols))
        self.value_header = self.key_header = None  # MAGIC + id, once known

    def native_plan(self) -> tuple:
        """What ``router._native.AvroConverter.plan`` takes after the ids and headers: each
        column's name as the envelope spells it, kind, parameter and unchanged-TOAST datum,
        and the key columns' indexes."""
        names = [n for n, _ in self.convs]
        placeholders = []
        for n in names:
            ph = self.placeholders[n]
            ph = ph.encode() if isinstance(ph, str) else ph
            placeholders.append(None if ph is None else _long_bytes(len(ph)) + ph)
        return (tuple(_schema_json(n) for n in names), bytes(k for k, _ in self._natives),
                tuple(p for _, p in self._natives), tuple(placeholders),
                tuple(names.index(k) for k in self.key_names))

    # each value of a row converted; None where the row has none or Avro cannot hold it
    def _datums(self, row: dict, convs) -> list:
        out = []
        for name, conv in convs:
            v = row.get(name)
            if v is None:
                out.append(None)
                continue
            try:
                out.append(conv(v))
            except (ValueError, TypeError, IndexError, OverflowError) as exc:
                raise RecordUnencodable(self._unencodable(name, v)) from exc
        return out

    def write_row(self, out: bytearray, row: dict | None, toast: list | None = None) -> None:
        if row is None:
            out.append(0)
            return
        out.append(2)
        datums = self._datums(row, self.convs)
        if toast:
            names = [n for n, _ in self.convs]
            for name in toast:
                datums[names.index(name)] = self.placeholders.get(name)
        for w, d in zip(self.writers, datums):
            w(out, d)

    def key(self, key: dict | None) -> bytes | None:
        if key is None or self.key_schema is None:
            return None
        out = bytearray(self.key_header)
        for (name, _), w, d in zip(self.key_convs, self.key_writers,
                                   self._datums(key, self.key_convs)):
            if d is None:
                raise RecordUnencodable(f"{self.table}: key column {name!r} value "
                                        f"{key.get(name)!r} has no Avro form (a key field "
                                        "cannot be null)")
            w(out, d)
        return bytes(out)

    def _unencodable(self, name: str, value) -> str:
        return unencodable(self.table, self.columns[name], value, "an Avro record", "Avro")


class AvroFormat:
    """Turns pgrouter's JSON records into Avro records in the Confluent wire format.
    ``learn`` each published ``TableSchema`` before a record naming it is converted (the sink
    sees schemas first); ``set_id`` the registry's id of each ``Subject`` that
    ``SchemasNeeded`` lists."""

    def __init__(self, naming: str = "topic"):
        if naming not in NAMING:
            raise ValueError(f"subject naming {naming!r}: one of {', '.join(NAMING)}")
        self.naming = naming
        self._schemas: dict[str, TableSchema] = {}
        self._tables: dict[tuple[str, str], _Table] = {}
        self._ids: dict[tuple[str, str], int] = {}  # (subject, schema text) -> id
        self._messages: dict[str, bytes] = {}  # topic -> header of the message schema
        self._native = None if NATIVE is None else NATIVE.AvroConverter()

    def learn(self, schema: TableSchema) -> None:
        self._schemas[schema.schema_id] = schema

    def set_id(self, subject: Subject, schema_id: int) -> None:
        self._ids[(subject.subject, subject.schema)] = schema_id

    def schema_of(self, schema_id: str) -> TableSchema | None:
        return self._schemas.get(schema_id)

    def _header(self, subject: Subject) -> bytes | None:
        sid = self._ids.get((subject.subject, subject.schema))
        return None if sid is None else MAGIC + sid.to_bytes(4, "big")

    def _table(self, schema_id: str, topic: str, missing: list) -> _Table | None:
        table = self._tables.get((schema_id, topic))
        if table is None:
            schema = self._schemas.get(schema_id)
            if schema is None:
                raise InternalError(f"record for {topic} names schema {schema_id}, which was "
                                    "not published before it")
            table = self._tables[(schema_id, topic)] = _Table(schema, topic, self.naming)
        if table.value_header is None:
            table.value_header = self._header(table.value_subject)
            if table.key_subject is not None:
                table.key_header = self._header(table.key_subject)
            if table.value_header is None or (table.key_subject is not None
                                              and table.key_header is None):
                if table.value_header is None:
                    missing.append(table.value_subject)
                if table.key_subject is not None and table.key_header is None:
                    missing.append(table.key_subject)
                table.value_header = table.key_header = None
                return None
            if self._native is not None:
                self._native.plan(schema_id, topic, table.value_header, table.key_header,
                                  *table.native_plan())
        return table

    def _message(self, topic: str, env: dict, headers, missing: list):
        header = self._messages.get(topic)
        if header is None:
            subject = Subject(subject_name(self.naming, topic, "value", "io.pgrouter.Message"),
                              _schema_json(MESSAGE_SCHEMA).decode(), topic)
            header = self._header(subject)
            if header is None:
                missing.append(subject)
                return None
            self._messages[topic] = header
        out = bytearray(header)
        _w_string(out, env["op"])
        _write_source(out, env["source"])
        _write_opt_long(out, env.get("ts_ms"))
        msg = env["message"]
        _w_string(out, msg["prefix"])
        out.append(1 if msg["transactional"] else 0)
        _w_bytes(out, base64.b64decode(msg["content"]))
        return (topic, None, bytes(out), headers)

    def convert(self, record: tuple, missing: list):
        """One record in Avro (a list of two for a key change), or None when a schema it
        needs has no id yet (appended to ``missing``)."""
        topic, key, value, headers = record
        env = _decode(value)
        if "op" not in env:  # transaction metadata (BEGIN/END): it stays JSON
            return record
        source = env.get("source")
        schema_id = source.get("schema_id")
        if not schema_id:
            if env.get("op") == "m":
                return self._message(topic, env, headers, missing)
            raise InternalError(f"record for {topic} has no schema_id: "
                                f"{value[:80].decode(errors='replace')}")
        table = self._table(schema_id, topic, missing)
        if table is None:
            return None
        op = env["op"]
        before, after = env.get("before"), env.get("after")
        toast = env.get("unchanged_toast")
        if op == "u" and before is not None and table.key_names and any(
                before.get(k) != after.get(k) for k in table.key_names):
            # a key change is a delete of the old key and a create of the new one, as
            # Debezium writes it (a sink upserting by key would keep the old row otherwise)
            return [(topic, table.key(before), self._value(table, before, None, source, "d",
                                                           env, None, "delete_old"), headers),
                    (topic, table.key(after), self._value(table, before, after, source, "c",
                                                          env, toast, "create_new"), headers)]
        key_bytes = None if key is None else table.key(_decode(key))
        return (topic, key_bytes, self._value(table, before, after, source, op, env, toast),
                headers)

    @staticmethod
    def _value(table: _Table, before, after, source, op, env, toast,
               key_change: str | None = None) -> bytes:
        out = bytearray(table.value_header)
        table.write_row(out, before)
        table.write_row(out, after, toast)
        _write_source(out, source)
        _w_string(out, op)
        _write_opt_long(out, env.get("ts_ms"))
        _write_toast(out, toast)
        _write_truncate(out, env.get("truncate"))
        _write_opt_string(out, key_change)
        return bytes(out)

    def _tombstone_key(self, missing: list, sid: str, topic: str, key: dict) -> bytes | None:
        return None if (t := self._table(sid, topic, missing)) is None else t.key(key)

    def convert_all(self, records: list) -> list:
        """Every record converted (a key change becomes two records); raises
        ``SchemasNeeded`` listing every schema of ``records`` without an id."""
        if self._native is None:
            return self._convert_all_py(records)
        missing: list = []
        convert = self.convert
        tombstone = Preceding(records, lambda *a: self._tombstone_key(missing, *a)).reshape
        out = self._native.convert_all(records, lambda record: convert(record, missing) if (
            record[2] is not None) else tombstone(record))
        if missing:
            raise SchemasNeeded(list(dict.fromkeys(missing)))
        return out

    def _convert_all_py(self, records: list) -> list:
        """``convert_all`` in Python: the reference of ``router._native.AvroConverter``."""
        out, missing = [], []
        convert = self.convert
        tombstone = Preceding(records, lambda *a: self._tombstone_key(missing, *a)).reshape
        for record in records:
            converted = convert(record, missing) if record[2] is not None else tombstone(record)
            if converted is None:
                continue
            if type(converted) is list:
                out.extend(converted)
            else:
                out.append(converted)
        if missing:
            raise SchemasNeeded(list(dict.fromkeys(missing)))
        return out


def split_header(data: bytes) -> tuple[int, bytes]:
    """(schema id, Avro body) of a Confluent wire-format record."""
    if len(data) < 5 or data[:1] != MAGIC:
        raise ValueError("not a Confluent wire-format record (no magic byte 0 and schema id)")
    return int.from_bytes(data[1:5], "big"), data[5:]
