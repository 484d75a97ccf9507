"""Reading pgrouter's Avro records back (``router.formats.avro``) as pgrouter's JSON envelope, so
every reader of the project (``pgrouter apply``, ``status``, ``verify``) takes either format.

Rules:

* A value whose first byte is ``0x00`` is Avro in the Confluent wire format (a JSON envelope
  starts with ``{``); ``schema_id`` names the schema to decode it with, which the caller
  fetches from the registry (by id, cached) and hands to ``learn``.
* Datums become the values the JSON format writes: integers, floats and booleans as they
  are; decimals, dates, times, timestamps, uuids, bytes (``\\x`` + hex) and arrays (a
  PostgreSQL array literal) as text PostgreSQL reads back into the column's type. Text is
  equal in meaning to the JSON format's, not always in spelling (timestamps are ISO-8601,
  timestamptz in UTC).
* Columns named in ``unchanged_toast`` are left out of ``after``, as the JSON format leaves
  them out; a key change, which Avro writes as a delete and a create, stays two records.
* Decoding uses ``fastavro`` (the ``avro`` extra); without it a clear error says so.
  Dates and timestamps are read as PostgreSQL's text by readers of pgrouter's own (the
  schema's logical types renamed ``pgrouter-…`` before fastavro parses it, fastavro's
  documented way to add logical types): fastavro's own give Python's ``date``/``datetime``,
  which hold neither BC dates nor years past 9999, and refuse such records.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import uuid
from decimal import Decimal

import msgspec

from .avro import COLUMN_PROP, MAGIC, split_header
from .connect_values import EXACT
from ..errors import DecodeError
from ..postgres.datetimes import date_text, timestamp_text

_VSD_FIELDS = frozenset({"scale", "value"})


def is_avro(value: bytes | None) -> bool:
    return bool(value) and value[:1] == MAGIC


def schema_id(value: bytes) -> int:
    return split_header(value)[0]


_US = {"timestamp-micros": 1, "timestamp-millis": 1000, "local-timestamp-micros": 1,
       "local-timestamp-millis": 1000}
#: pgrouter's readers of Avro's date and timestamp logical types: PostgreSQL's text
_READERS = {"int-pgrouter-date": lambda d, *_: date_text(d)} | {
    f"long-pgrouter-{name}": (lambda unit, zone: lambda n, *_: timestamp_text(n * unit, zone))(
        unit, "" if name.startswith("local-") else "+00:00") for name, unit in _US.items()}


def _fastavro():
    try:
        import fastavro
        import fastavro.read
    except ImportError:
        raise DecodeError("reading Avro records needs fastavro: pip install "
                          "'pgrouter[avro]'") from None
    fastavro.read.LOGICAL_READERS.update(_READERS)
    return fastavro


def _own_logical_types(schema):
    """``schema`` with the date and timestamp logical types renamed for ``_READERS``."""
    if isinstance(schema, list):
        return [_own_logical_types(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _own_logical_types(v) for k, v in schema.items()}
    if out.get("logicalType") == "date" or out.get("logicalType") in _US:
        out["logicalType"] = "pgrouter-" + out["logicalType"]
    return out


def _array_item(v) -> str:
    if v is None:
        return "NULL"
    text = _text(v)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _text(v) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "t" if v else "f"
    if isinstance(v, Decimal):
        return format(v, "f")
    if isinstance(v, (bytes, bytearray)):
        return "\\x" + bytes(v).hex()
    if isinstance(v, dict) and v.keys() == _VSD_FIELDS:
        return format(Decimal(int.from_bytes(v["value"], "big", signed=True)).scaleb(
            -v["scale"], EXACT), "f")
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" ")
    if isinstance(v, (dt.date, dt.time, uuid.UUID)):
        return str(v) if isinstance(v, uuid.UUID) else v.isoformat()
    if isinstance(v, list):
        return "{" + ",".join(_array_item(e) for e in v) + "}"
    return str(v)


def json_value(v):
    """A datum as the JSON format writes the column's value."""
    if v is None or isinstance(v, (bool, int, float)):
        return v
    return _text(v)


def _row(row: dict | None, toast: list | None, columns: dict) -> dict | None:
    if row is None:
        return None
    skip = frozenset(toast or ())
    return {columns.get(k, k): json_value(v) for k, v in row.items()
            if columns.get(k, k) not in skip}


def _columns(schema: dict) -> dict[str, str]:
    """field -> PostgreSQL column, for fields whose name is not the column's
    (``router.formats.avro.COLUMN_PROP``): of the key record, or of the envelope's row record."""
    fields = schema.get("fields") or []
    for f in fields:
        if f.get("name") == "before":  # an envelope: the row record is defined here
            types = f["type"] if isinstance(f["type"], list) else [f["type"]]
            rows = [t for t in types if isinstance(t, dict)]
            fields = rows[0]["fields"] if rows else []
            break
    return {f["name"]: f[COLUMN_PROP] for f in fields if COLUMN_PROP in f}


class AvroReader:
    """Decodes pgrouter's Avro records with the schemas ``learn``-ed by id."""

    def __init__(self):
        self._fastavro = _fastavro()
        self._schemas: dict[int, object] = {}
        self._columns: dict[int, dict[str, str]] = {}  # sid -> renamed fields

    def knows(self, sid: int) -> bool:
        return sid in self._schemas

    def learn(self, sid: int, schema_text: str) -> None:
        try:
            schema = json.loads(schema_text)
            self._columns[sid] = _columns(schema) if isinstance(schema, dict) else {}
            self._schemas[sid] = self._fastavro.parse_schema(_own_logical_types(schema))
        except (ValueError, TypeError, self._fastavro.schema.SchemaParseException) as exc:
            raise DecodeError(f"schema {sid} of the registry is not an Avro schema: "
                              f"{exc}") from exc

    def datum(self, value: bytes):
        """The decoded datum of a wire-format record (its schema learnt before)."""
        sid, body = split_header(value)
        schema = self._schemas.get(sid)
        if schema is None:
            raise DecodeError(f"record names schema id {sid}, which was not fetched")
        try:
            return self._fastavro.schemaless_reader(io.BytesIO(body), schema)
        except Exception as exc:  # fastavro raises several kinds on short or bad bodies
            raise DecodeError(f"Avro record with schema id {sid} does not decode: "
                              f"{type(exc).__name__}: {exc}") from exc

    def envelope(self, value: bytes, *, updates: bool = False) -> dict | None:
        """The record as pgrouter's JSON envelope (a dict). With ``updates``, a key change is
        one update again, as the JSON format writes it: its ``create_new`` half becomes the
        update and its ``delete_old`` half is None (for ``pgrouter apply``, whose
        transaction counts are the JSON format's)."""
        d = self.datum(value)
        if not isinstance(d, dict) or "op" not in d or "source" not in d:
            raise DecodeError("Avro record is not a pgrouter envelope (no op/source)")
        op = d["op"]
        if updates and d.get("key_change") == "delete_old":
            return None
        if updates and d.get("key_change") == "create_new":
            op = "u"
        toast = d.get("unchanged_toast")
        columns = self._columns.get(split_header(value)[0], {})
        env = {"op": op, "before": _row(d.get("before"), None, columns),
               "after": _row(d.get("after"), toast, columns), "source": d["source"],
               "ts_ms": d.get("ts_ms")}
        if toast:
            env["unchanged_toast"] = toast
        if d.get("truncate") is not None:
            env["truncate"] = d["truncate"]
        if d.get("message") is not None:
            msg = d["message"]
            env["message"] = {"prefix": msg["prefix"], "transactional": msg["transactional"],
                              "content": base64.b64encode(msg["content"]).decode()}
        return env

    def key(self, value: bytes) -> dict:
        d = self.datum(value)
        columns = self._columns.get(split_header(value)[0], {})
        return {columns.get(k, k): json_value(v) for k, v in d.items()}

    def to_json(self, value: bytes, *, updates: bool = False) -> bytes | None:
        env = self.envelope(value, updates=updates)
        return None if env is None else msgspec.json.encode(env)
