"""PostgreSQL text-format values to Python values, by type OID.

Rules:

* Resolve once, convert many: ``converter_for(type_oid)`` returns a plain callable
  ``str -> value``; callers look it up once per column (``row_converter`` does it per
  relation) and the decoder never converts anything itself, so conversion is paid only by
  consumers that want Python values.
* Converters take the text PostgreSQL's output function produced (DateStyle ISO, as the
  walsender and the SQL interface use by default). They never see NULL, unchanged TOAST or
  binary values: ``row_converter`` passes those through unchanged.
* Representations: int2/4/8, oid, xid → ``int``; float4/8 → ``float`` (``NaN``, ``Infinity``,
  ``-Infinity`` included); numeric → ``Decimal`` (``Decimal('NaN')``, ``±Infinity``); bool →
  ``bool``; bytea (hex or escape output) → ``bytes``; uuid → ``uuid.UUID``; date → ``date``;
  time → ``time``; timestamp → naive ``datetime``; timestamptz → aware ``datetime``.
* Values Python's ``datetime`` cannot hold — ``infinity``, ``-infinity``, BC dates, years
  after 9999, ``24:00:00`` — stay PostgreSQL's text (``str``). Callers must be ready for a
  ``str`` from date/time columns; the text is lossless, a clamped datetime would not be.
* Everything else (interval, json, jsonb, enums, arrays, ranges, geometric, money, …) stays
  text: the text form is lossless and the envelope carries it as is.
* Malformed text for a typed column raises ``DecodeError`` (the server sent something its own
  output function cannot produce).
"""

from __future__ import annotations

import datetime as _dt
import uuid as _uuid
from decimal import Decimal, InvalidOperation
from typing import Callable

from ..errors import DecodeError
from ..pgoutput.messages import UNCHANGED_TOAST

Converter = Callable[[str], object]

# Built-in type OIDs (src/include/catalog/pg_type.dat).
BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID, XID = 16, 17, 18, 19, 20, 21, 23, 25, 26, 28
JSON, FLOAT4, FLOAT8, MONEY, BPCHAR, VARCHAR = 114, 700, 701, 790, 1042, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ = 1082, 1083, 1114, 1184, 1186, 1266
NUMERIC, UUID, PG_LSN, JSONB, XID8 = 1700, 2950, 3220, 3802, 5069


def _text(value: str) -> str:
    return value


def _bool(value: str) -> bool:
    if value == "t":
        return True
    if value == "f":
        return False
    raise DecodeError(f"not a boolean: {value[:40]!r}")


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise DecodeError(f"not an integer: {value[:40]!r}") from None


def _float(value: str) -> float:
    try:
        return float(value)  # accepts NaN, Infinity, -Infinity as PostgreSQL writes them
    except ValueError:
        raise DecodeError(f"not a float: {value[:40]!r}") from None


def _numeric(value: str) -> Decimal:
    try:
        return Decimal(value)
    except InvalidOperation:
        raise DecodeError(f"not a numeric: {value[:40]!r}") from None


def _bytea(value: str) -> bytes:
    try:
        if value.startswith("\\x"):
            return bytes.fromhex(value[2:])
        return _bytea_escape(value)
    except ValueError:
        raise DecodeError(f"not a bytea: {value[:40]!r}") from None


def _bytea_escape(value: str) -> bytes:
    """``bytea_output = escape``: printable ASCII as is, ``\\\\`` and ``\\nnn`` octal."""
    out = bytearray()
    i, n = 0, len(value)
    while i < n:
        ch = value[i]
        if ch != "\\":
            out += ch.encode("latin-1")
            i += 1
        elif value.startswith("\\\\", i):
            out.append(0x5C)
            i += 2
        else:
            octal = value[i + 1:i + 4]
            if len(octal) != 3 or not all(c in "01234567" for c in octal):
                raise ValueError("bad escape")
            out.append(int(octal, 8) & 0xFF)
            i += 4
    return bytes(out)


def _uuid_value(value: str) -> _uuid.UUID:
    try:
        return _uuid.UUID(value)
    except ValueError:
        raise DecodeError(f"not a uuid: {value[:40]!r}") from None


def _or_text(parse: Callable[[str], object]) -> Converter:
    """Values datetime cannot represent (infinity, BC, year > 9999, 24:00) stay text."""

    def convert(value: str):
        try:
            return parse(value)
        except ValueError:
            return value

    return convert


_fromiso = _dt.datetime.fromisoformat

CONVERTERS: dict[int, Converter] = {
    BOOL: _bool, BYTEA: _bytea, INT2: _int, INT4: _int, INT8: _int, OID: _int, XID: _int,
    XID8: _int, FLOAT4: _float, FLOAT8: _float, NUMERIC: _numeric, UUID: _uuid_value,
    DATE: _or_text(_dt.date.fromisoformat), TIME: _or_text(_dt.time.fromisoformat),
    TIMETZ: _or_text(_dt.time.fromisoformat), TIMESTAMP: _or_text(_fromiso),
    TIMESTAMPTZ: _or_text(_fromiso),
}

def converter_for(type_oid: int) -> Converter:
    """The ``str -> value`` converter for a column of type ``type_oid`` (identity for types
    kept as text, including every type pgrouter does not know)."""
    return CONVERTERS.get(type_oid, _text)


def row_converter(type_oids) -> Callable[[tuple], tuple]:
    """Convert a whole decoded tuple; NULL, unchanged TOAST and binary values pass through.
    ``type_oids``: the column type OIDs in order (``[c.type_oid for c in rel.columns]``)."""
    converters = tuple(converter_for(oid) for oid in type_oids)

    def convert(values: tuple) -> tuple:
        if len(values) != len(converters):
            raise DecodeError(f"tuple has {len(values)} columns, relation has "
                              f"{len(converters)}")
        return tuple(conv(v) if type(v) is str else v for conv, v in zip(converters, values))

    return convert


__all__ = ["CONVERTERS", "Converter", "converter_for", "row_converter",
           "UNCHANGED_TOAST"]
