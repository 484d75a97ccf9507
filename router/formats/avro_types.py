"""Avro types of PostgreSQL columns for ``router.formats.avro``: each column type's Avro schema (as
Confluent's ``AvroData`` writes the Kafka Connect type Debezium gives it, with Avro's logical
type where one fits), how a value of pgrouter's JSON envelope becomes its datum, and the
Avro binary writer of that datum.

Rules: the mapping table is in ``router.formats.avro``'s rules and ``docs/record-formats.md``; a
value Avro's type cannot hold (numeric NaN, a date ``infinity``, a timestamp past 294247 AD in µs)
converts to None and is written as null; dates and timestamps are read over PostgreSQL's
whole range (``router.postgres.datetimes``: BC and years past 9999 included); a value that cannot be
converted at all raises (``ValueError`` & co., turned into
``RecordUnencodable`` by the caller). No I/O, no state.
"""

from __future__ import annotations

import struct

import msgspec

from . import connect_values as values
from .connect_values import PLACEHOLDER, array_values, micro_time, milli_time
from .schema import ColumnSchema, element_modifiers

_pack_float = struct.Struct("<f").pack
_pack_double = struct.Struct("<d").pack


# -- Avro binary encoding -------------------------------------------------------------------

def _long(out: bytearray, n: int) -> None:
    n = (n << 1) ^ (n >> 63)
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _long_bytes(n: int) -> bytes:
    out = bytearray()
    _long(out, n)
    return bytes(out)


def _w_string(out: bytearray, v: str) -> None:
    b = v.encode()
    _long(out, len(b))
    out += b


def _w_bytes(out: bytearray, v: bytes) -> None:
    _long(out, len(v))
    out += v


def _w_bool(out: bytearray, v: bool) -> None:
    out.append(1 if v else 0)


def _w_float(out: bytearray, v: float) -> None:
    out += _pack_float(v)


def _w_double(out: bytearray, v: float) -> None:
    out += _pack_double(v)


def w_array(out: bytearray, items: list, write_item) -> None:
    """An Avro array: one block of ``len(items)`` items (none when empty), then the end."""
    if items:
        _long(out, len(items))
        for e in items:
            write_item(out, e)
    out.append(0)


def _optional(write):
    """Writer of ``["null", T]``: union index 0 for None, 1 and the value otherwise."""
    def w(out: bytearray, v) -> None:
        if v is None:
            out.append(0)
        else:
            out.append(2)
            write(out, v)
    return w


# -- PostgreSQL values (JSON envelope form) → Avro datums ------------------------------------
# Each converter takes the JSON value of a non-null column and returns the datum to write,
# or None when Avro's type cannot hold it (it is written as null, as the rules say).

def _int(v):
    return int(v)


def _float(v):
    return values.float_text(v) if isinstance(v, str) else float(v)


def _bool(v):
    return v if isinstance(v, bool) else v == "t"


def _text(v):
    return v if isinstance(v, str) else msgspec.json.encode(v).decode()


def _decimal(scale: int):
    return lambda v: values.unscaled(v if isinstance(v, str) else str(v), scale)


def _variable_decimal(v):
    return values.variable_decimal(v if isinstance(v, str) else str(v))


_bytea, _date = values.bytea, values.date
_local_micros, _local_millis = values.timestamp(False, False), values.timestamp(False, True)
_utc_micros, _utc_millis = values.timestamp(True, False), values.timestamp(True, True)


_INT = {"int2": ("int", "int16"), "int4": ("int", None), "int8": ("long", None),
        "oid": ("long", None)}
_NAMED_STRINGS = {"json": "io.debezium.data.Json", "jsonb": "io.debezium.data.Json",
                  "timetz": "io.debezium.time.ZonedTime", "xml": "io.debezium.data.Xml"}
_VSD = "io.debezium.data.VariableScaleDecimal"
# logical types AvroData reads as Kafka Connect's own carry Connect's names (router.formats.avro)
_CONNECT_LOGICAL = {"date": "org.apache.kafka.connect.data.Date",
                    "time-millis": "org.apache.kafka.connect.data.Time",
                    "timestamp-millis": "org.apache.kafka.connect.data.Timestamp"}


#: the kinds of router._native.AvroConverter (avro_values.h): how the C converts and writes a
#: column's value; "other" (arrays) is left to Python
NATIVE_KINDS = {name: i for i, name in enumerate((
    "other", "long", "float", "double", "bool", "string", "bytea", "decimal", "vsd", "date",
    "ts_local_micros", "ts_local_millis", "ts_utc_micros", "ts_utc_millis", "time_micros",
    "time_millis"))}


class _Type(msgspec.Struct, frozen=True):
    """One column type: its Avro schema, how a JSON value becomes a datum, how it is written,
    whether an unchanged TOAST value has a placeholder of that type, and the same conversion
    as a kind of ``router._native.AvroConverter`` (kind, parameter)."""

    schema: object
    convert: object
    write: object
    placeholder: object = None
    native: tuple = (0, 0)


def _native(kind: str, param: int = 0) -> tuple:
    return (NATIVE_KINDS[kind], param)


def _named_vsd(defined: set) -> object:
    if _VSD in defined:
        return _VSD
    defined.add(_VSD)
    return {"type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data",
            "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}],
            "connect.name": _VSD, "connect.version": 1,
            "connect.doc": "Variable scaled decimal"}


def _w_vsd(out: bytearray, v) -> None:
    _long(out, v[0])
    _w_bytes(out, v[1])


def _column_type(type_name: str, precision: int | None, scale: int | None,
                 defined: set) -> _Type:
    if type_name == "bool":
        return _Type("boolean", _bool, _w_bool, native=_native("bool"))
    if type_name in _INT:
        avro, connect_type = _INT[type_name]
        schema = {"type": avro, "connect.type": connect_type} if connect_type else avro
        return _Type(schema, _int, _long, native=_native("long"))
    if type_name in ("float4", "float8"):
        return (_Type("float", _float, _w_float, native=_native("float"))
                if type_name == "float4"
                else _Type("double", _float, _w_double, native=_native("double")))
    if type_name == "numeric":
        if scale is not None and precision:
            s = max(scale, 0)
            p = max(precision - min(scale, 0), s)  # Avro: precision ≥ scale ≥ 0
            params = {"scale": str(s), "connect.decimal.precision": str(p)}
            return _Type({"type": "bytes", "logicalType": "decimal", "precision": p,
                          "scale": s, "connect.version": 1, "connect.parameters": params,
                          "connect.name": "org.apache.kafka.connect.data.Decimal"},
                         _decimal(s), _w_bytes, native=_native("decimal", s))
        return _Type(_named_vsd(defined), _variable_decimal, _w_vsd, native=_native("vsd"))
    if type_name == "bytea":
        return _Type("bytes", _bytea, _w_bytes, PLACEHOLDER.encode(), _native("bytea"))
    if type_name == "date":
        return _Type({"type": "int", "logicalType": "date", "connect.version": 1,
                      "connect.name": _CONNECT_LOGICAL["date"]}, _date, _long,
                     native=_native("date"))
    if type_name in ("timestamp", "timestamptz"):
        millis = precision is not None and precision <= 3
        local = type_name == "timestamp"
        logical = ("local-" if local else "") + ("timestamp-millis" if millis else
                                                 "timestamp-micros")
        name = _CONNECT_LOGICAL.get(logical, "io.debezium.time." + (
            "Timestamp" if millis else "MicroTimestamp"))
        conv = ((_local_millis if millis else _local_micros) if local else
                (_utc_millis if millis else _utc_micros))
        kind = f"ts_{'local' if local else 'utc'}_{'millis' if millis else 'micros'}"
        return _Type({"type": "long", "logicalType": logical, "connect.version": 1,
                      "connect.name": name}, conv, _long, native=_native(kind))
    if type_name == "time":
        if precision is not None and precision <= 3:
            return _Type({"type": "int", "logicalType": "time-millis", "connect.version": 1,
                          "connect.name": _CONNECT_LOGICAL["time-millis"]}, milli_time,
                         _long, native=_native("time_millis"))
        return _Type({"type": "long", "logicalType": "time-micros", "connect.version": 1,
                      "connect.name": "io.debezium.time.MicroTime"}, micro_time, _long,
                     native=_native("time_micros"))
    if type_name == "uuid":
        return _Type({"type": "string", "logicalType": "uuid", "connect.version": 1,
                      "connect.name": "io.debezium.data.Uuid"}, _text, _w_string, PLACEHOLDER,
                     _native("string"))
    if type_name in _NAMED_STRINGS:
        return _Type({"type": "string", "connect.version": 1,
                      "connect.name": _NAMED_STRINGS[type_name]}, _text, _w_string, PLACEHOLDER,
                     _native("string"))
    return _Type("string", _text, _w_string, PLACEHOLDER, _native("string"))


_FROM_TEXT = {_int: int, _float: _float, _bool: lambda v: v == "t"}


def _array_type(col: ColumnSchema, defined: set) -> _Type:
    # the column's modifiers are its elements' (numeric(6,2)[] → decimal(6,2) elements)
    item = _column_type(col.element, *element_modifiers(col), defined)
    conv = _FROM_TEXT.get(item.convert, item.convert)
    nested_ok = item.write is _w_string  # inner arrays of a text array stay text
    write_item = _optional(item.write)

    def convert(v):
        return array_values(v, conv, nested_ok)

    def write(out: bytearray, items: list) -> None:
        w_array(out, items, write_item)
    return _Type({"type": "array", "items": ["null", item.schema]}, convert, write)


def column_type(col: ColumnSchema, defined: set) -> _Type:
    """The Avro type of a column (``defined``: named types already in the schema)."""
    if col.element is not None:
        return _array_type(col, defined)
    return _column_type(col.type, col.precision, col.scale, defined)
