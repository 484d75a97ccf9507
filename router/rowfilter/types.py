"""PostgreSQL types a row filter can compute with, and how their text form is read.

Values inside a compiled filter are plain Python objects, chosen so that Python's own
comparison gives PostgreSQL's order wherever possible:

=====================  ==========================================================
bool                   ``bool``
int2 / int4 / int8     ``int`` (range-checked per width)
numeric                ``decimal.Decimal`` (NaN handled apart: PostgreSQL says NaN = NaN)
float4 / float8        ``float`` (float4 rounded to single precision; NaN = NaN, NaN sorts last)
text / varchar / name  ``str`` compared by code point = UTF-8 byte order = collation "C"
bpchar                 ``str`` as sent (padded); comparisons ignore trailing spaces
date                   ``int`` days since 1970-01-01, ±``inf`` for ±infinity
timestamp(tz)          ``int`` µs since 1970-01-01 (UTC), ±``inf`` for ±infinity
uuid                   ``int`` (128-bit, so byte order = numeric order)
=====================  ==========================================================

Text is compared with the "C" collation. PostgreSQL uses the column's collation; filters on
text columns whose collation is not C/POSIX may order differently (equality agrees for
deterministic collations).
"""

from __future__ import annotations

import struct
import uuid as _uuid
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation

from ..postgres.arrays import NestedArray, array_items
from . import temporal


@dataclass(frozen=True, slots=True)
class PgType:
    name: str  # PostgreSQL's internal name: int4, bpchar, timestamptz
    oid: int
    category: str  # PostgreSQL's typcategory: B, N, S, D, U, X (unsupported), A (array), u
    display: str  # as format_type prints it, for messages
    elem: "PgType | None" = None

    def __repr__(self) -> str:
        return self.display


def _t(name, oid, cat, display):
    return PgType(name, oid, cat, display)


BOOL = _t("bool", 16, "B", "boolean")
INT2 = _t("int2", 21, "N", "smallint")
INT4 = _t("int4", 23, "N", "integer")
INT8 = _t("int8", 20, "N", "bigint")
NUMERIC = _t("numeric", 1700, "N", "numeric")
FLOAT4 = _t("float4", 700, "N", "real")
FLOAT8 = _t("float8", 701, "N", "double precision")
TEXT = _t("text", 25, "S", "text")
VARCHAR = _t("varchar", 1043, "S", "character varying")
BPCHAR = _t("bpchar", 1042, "S", "character")
NAME = _t("name", 19, "S", "name")
DATE = _t("date", 1082, "D", "date")
TIMESTAMP = _t("timestamp", 1114, "D", "timestamp without time zone")
TIMESTAMPTZ = _t("timestamptz", 1184, "D", "timestamp with time zone")
UUID = _t("uuid", 2950, "U", "uuid")
UNKNOWN = _t("unknown", 705, "u", "unknown")
# types a column may have, but that a filter can only test with IS [NOT] NULL
BYTEA = _t("bytea", 17, "X", "bytea")
OID = _t("oid", 26, "X", "oid")
TIME = _t("time", 1083, "X", "time without time zone")
INTERVAL = _t("interval", 1186, "X", "interval")
JSON = _t("json", 114, "X", "json")
JSONB = _t("jsonb", 3802, "X", "jsonb")

BY_OID = {t.oid: t for t in (BOOL, INT2, INT4, INT8, NUMERIC, FLOAT4, FLOAT8, TEXT, VARCHAR,
                             BPCHAR, NAME, DATE, TIMESTAMP, TIMESTAMPTZ, UUID, BYTEA, OID, TIME,
                             INTERVAL, JSON, JSONB)}

INTS = (INT2, INT4, INT8)
INT_RANGE = {INT2: (-(1 << 15), (1 << 15) - 1), INT4: (-(1 << 31), (1 << 31) - 1),
             INT8: (-(1 << 63), (1 << 63) - 1)}
STRINGS = (TEXT, VARCHAR, BPCHAR, NAME)
FLOATS = (FLOAT4, FLOAT8)


def array_of(elem: PgType) -> PgType:
    return PgType("_" + elem.name, 0, "A", elem.display + "[]", elem)


_NAMES = {
    "integer": INT4, "int": INT4, "int4": INT4, "smallint": INT2, "int2": INT2,
    "bigint": INT8, "int8": INT8, "real": FLOAT4, "float4": FLOAT4,
    "double precision": FLOAT8, "float8": FLOAT8, "float": FLOAT8, "numeric": NUMERIC,
    "decimal": NUMERIC, "dec": NUMERIC, "text": TEXT, "varchar": VARCHAR,
    "character varying": VARCHAR, "char varying": VARCHAR, "char": BPCHAR, "character": BPCHAR,
    "bpchar": BPCHAR, "boolean": BOOL, "bool": BOOL, "date": DATE, "timestamp": TIMESTAMP,
    "timestamp without time zone": TIMESTAMP, "timestamptz": TIMESTAMPTZ,
    "timestamp with time zone": TIMESTAMPTZ, "uuid": UUID, "name": NAME,
    "bytea": BYTEA, "oid": OID, "time": TIME, "time without time zone": TIME,
    "interval": INTERVAL, "json": JSON, "jsonb": JSONB,
}
_KNOWN_UNSUPPORTED = {"timetz", "time with time zone", "xml", "inet", "cidr", "macaddr", "money",
                      "bit", "varbit", "bit varying", "point", "line", "box", "circle", "path",
                      "polygon", "lseg", "tsvector", "tsquery", "int4range", "regclass",
                      "regtype", "regproc", "jsonpath", "pg_lsn", "xid", "cid", "tid"}


def resolve_type_name(name: str, mods: tuple[int, ...]) -> tuple[PgType, int]:
    """(type, typmod) for a type name as written in a cast; KeyError/LookupError if unknown.

    typmod: length for char/varchar, (precision, scale) packed as PostgreSQL does for numeric,
    -1 when absent. ``char`` / ``character`` without a length mean ``char(1)``.
    """
    if name == "float" and mods:
        return (FLOAT4 if mods[0] <= 24 else FLOAT8), -1
    typ = _NAMES.get(name)
    if typ is None:
        if name in _KNOWN_UNSUPPORTED:
            raise NotImplementedError(name)
        raise KeyError(name)
    typmod = -1
    if typ in (VARCHAR, BPCHAR):
        if mods:
            typmod = mods[0]
        elif name in ("char", "character"):
            typmod = 1
    elif typ is NUMERIC and mods:
        precision, scale = mods[0], (mods[1] if len(mods) > 1 else 0)
        typmod = (precision << 16) | (scale & 0xFFFF)
    return typ, typmod


# --- reading text -------------------------------------------------------------------------

_BOOL_WORDS = {"t": True, "true": True, "y": True, "yes": True, "on": True, "1": True,
               "f": False, "false": False, "n": False, "no": False, "off": False, "0": False}


def _parse_bool(s: str) -> bool:
    low = s.strip().lower()
    if low in _BOOL_WORDS:
        return _BOOL_WORDS[low]
    for word, value in (("true", True), ("false", False), ("yes", True), ("no", False)):
        if low and word.startswith(low):
            return value
    raise ValueError(s)


def _int_parser(typ: PgType):
    lo, hi = INT_RANGE[typ]

    def parse(s: str) -> int:
        v = int(s)
        if not lo <= v <= hi:
            raise OverflowError(f'value "{s}" is out of range for type {typ.display}')
        return v
    return parse


def parse_numeric(s: str) -> Decimal:
    s = s.strip()
    low = s.lower()
    if low in ("infinity", "+infinity", "inf", "+inf"):
        return Decimal("Infinity")
    if low in ("-infinity", "-inf"):
        return Decimal("-Infinity")
    if low == "nan":
        return Decimal("NaN")
    if not s or s[-1] in "nN" or "_" in s:
        raise ValueError(s)
    return normalize_numeric(Decimal(s))


_BIG = Context(prec=1_000_000, Emax=999_999_999, Emin=-999_999_999)


def normalize_numeric(d: Decimal) -> Decimal:
    """PostgreSQL keeps no positive exponent: 1e3 is 1000 with display scale 0."""
    if d.is_finite() and d.as_tuple().exponent > 0:
        return d.quantize(Decimal(1), context=_BIG)
    return d


_FLOAT_WORDS = {"nan": float("nan"), "infinity": float("inf"), "+infinity": float("inf"),
                "-infinity": float("-inf"), "inf": float("inf"), "+inf": float("inf"),
                "-inf": float("-inf")}


def parse_float8(s: str) -> float:
    s = s.strip()
    low = s.lower()
    if low in _FLOAT_WORDS:
        return _FLOAT_WORDS[low]
    if "_" in s or low.endswith(("n", "y")):
        raise ValueError(s)
    v = float(s)
    if v in (float("inf"), float("-inf")):
        raise OverflowError(f'"{s}" is out of range for type double precision')
    return v


_F4 = struct.Struct("f")


def to_float4(v: float) -> float:
    """Round a double to single precision, as storing it in a float4 does."""
    try:
        return _F4.unpack(_F4.pack(v))[0]
    except OverflowError:
        return float("inf") if v > 0 else float("-inf")


def parse_float4(s: str) -> float:
    v = parse_float8(s)
    r = to_float4(v)
    if r in (float("inf"), float("-inf")) and v not in (float("inf"), float("-inf")):
        raise OverflowError(f'"{s}" is out of range for type real')
    return r


def _parse_uuid(s: str) -> int:
    return _uuid.UUID(s.strip()).int


def _identity(s: str) -> str:
    return s


PARSERS = {
    BOOL: _parse_bool, INT2: _int_parser(INT2), INT4: _int_parser(INT4),
    INT8: _int_parser(INT8), NUMERIC: parse_numeric, FLOAT4: parse_float4,
    FLOAT8: parse_float8, TEXT: _identity, VARCHAR: _identity, BPCHAR: _identity,
    NAME: _identity, DATE: temporal.parse_date,
    TIMESTAMP: lambda s: temporal.parse_timestamp(s, with_zone=False),
    TIMESTAMPTZ: lambda s: temporal.parse_timestamp(s, with_zone=True), UUID: _parse_uuid,
}
# a column of an unsupported type is still passed through (only IS [NOT] NULL uses it)
for _t_ in (BYTEA, OID, TIME, INTERVAL, JSON, JSONB):
    PARSERS[_t_] = _identity


def parse_text(typ: PgType, text: str):
    """Read PostgreSQL text form as a value of ``typ``; ValueError/OverflowError on bad input."""
    try:
        return PARSERS[typ](text)
    except InvalidOperation as exc:
        raise ValueError(text) from exc


def parse_array(elem: PgType, text: str) -> tuple:
    """A one-dimensional array literal ``{1,2,NULL,"a b"}``, its elements read as ``elem``."""
    try:
        items = array_items(text)
    except NestedArray:
        raise NotImplementedError("multidimensional arrays") from None
    return tuple(None if t is None else parse_text(elem, t) for t in items)
