"""pgrouter's Avro records (``router.formats.avro``, its C fast lane and its Python twin) byte for
byte against fastavro's encoder (``fastavro.schemaless_writer``) on generated tables and values:
every column type at the edges of its range (dates from 4713 BC to 5874897 AD, timestamps to
294276 AD and where Avro's long ends, time 24:00:00, ±infinity, int and float limits, NaN,
numerics of many digits and negative scales, arrays with NULLs and typmod'd elements,
domain values that arrive as text).

The expected datums are computed here, independently of ``router.postgres.datetimes``: a date's days
from Python's ``date`` after moving its year into 2000–2399 by whole 400-year cycles
(146097 days each), decimals by fastavro itself (``Decimal`` → bytes)."""

from __future__ import annotations

import calendar
import datetime as dt
import io
import json
from decimal import Decimal

import fastavro
import msgspec
import pytest
from fastavro._logical_writers_py import prepare_bytes_decimal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.formats.avro import AvroFormat, SchemasNeeded, split_header
from router.native import NATIVE
from router.formats.schema import ColumnSchema, TableSchema

TOPIC = "app.public.t"
SOURCE = {"db": "shop", "schema": "public", "table": "t", "lsn": 5, "commit_lsn": 6, "seq": 0,
          "xid": 9, "commit_time": "2024-01-02T03:04:05.000001Z", "origin": None,
          "origin_lsn": None, "route": "app", "schema_id": "s1"}
EPOCH = dt.date(1970, 1, 1)
DAY = 86_400_000_000
INT64 = (-2**63, 2**63 - 1)


# -- the reference: PostgreSQL's text of a value and the datum Avro holds ------------------

def ref_days(y: int, m: int, d: int) -> int:
    """Days since 1970 of the proleptic Gregorian (y, m, d) (y: astronomical, 0 = 1 BC)."""
    y2 = 2000 + (y - 2000) % 400
    return (dt.date(y2, m, d) - EPOCH).days + (y - y2) // 400 * 146097


def date_text(y: int, m: int, d: int) -> str:
    return f"{y:04d}-{m:02d}-{d:02d}" if y > 0 else f"{1 - y:04d}-{m:02d}-{d:02d} BC"


@st.composite
def dates(draw, top=5874897):
    """(text, days): years 4713 BC … ``top``, the edges drawn often."""
    y = draw(st.one_of(st.sampled_from([-4712, -1, 0, 1, 1969, 1970, 9999, 10000, top]),
                       st.integers(-4712, top)))
    m = draw(st.integers(1, 12))
    d = draw(st.integers(1, calendar.monthrange(2000 + (y - 2000) % 400, m)[1]))
    return date_text(y, m, d), ref_days(y, m, d)


def clock(us: int) -> str:
    s, frac = divmod(us, 1_000_000)
    text = f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"
    return text + ("." + f"{frac:06d}".rstrip("0") if frac else "")


@st.composite
def timestamps(draw, zoned: bool):
    """(text, µs since the epoch at UTC) as PostgreSQL prints them (the year to 294276,
    the offsets it prints: ±HH, ±HH:MM, ±HH:MM:SS)."""
    dtext, days = draw(dates(top=294276))
    tod = draw(st.one_of(st.sampled_from([0, DAY - 1, 14454_775807, 14454_775808]),
                         st.integers(0, DAY - 1)))
    body, bc = (dtext[:-3], " BC") if dtext.endswith(" BC") else (dtext, "")
    text, us = f"{body} {clock(tod)}", days * DAY + tod
    if zoned:
        off = draw(st.one_of(st.just(0), st.integers(-15 * 3600 - 59 * 60, 15 * 3600 + 59 * 60)))
        h, rest = divmod(abs(off), 3600)
        zone = ("-" if off < 0 else "+") + f"{h:02d}" + (
            "" if not rest else f":{rest // 60:02d}" + (f":{rest % 60:02d}" if rest % 60 else ""))
        text, us = text + zone, us - off * 1_000_000
    return text + bc, us


def in_long(n):
    return n if INT64[0] <= n <= INT64[1] else None


def typmod_numeric(p, s):
    return ((p << 16) | (s & 0x7FF)) + 4


def col(name, type_, *, precision=None, scale=None, element=None, typmod=-1):
    return ColumnSchema(name, type_, 0, type_modifier=typmod, precision=precision, scale=scale,
                        element=element)


NONFINITE = st.sampled_from(["NaN", "Infinity", "-Infinity"]).map(lambda v: (v, None))


def numerics(p: int, s: int):
    """(text, Decimal) of numeric(p, s): as many digits as p allows, at scale s."""
    limit = 10 ** p - 1

    def value(n):
        if s < 0:
            return str(n * 10 ** -s), Decimal(n * 10 ** -s)
        d = Decimal((int(n < 0), tuple(int(c) for c in str(abs(n))), -s))  # exact
        return format(d, "f"), d
    return st.one_of(st.sampled_from([0, limit, -limit, 1, -1, 127, -128, 128, -129]),
                     st.integers(-limit, limit)).map(value)


def vsd(v):
    d = Decimal(v)
    scale = max(0, -d.as_tuple().exponent)
    return {"scale": scale, "value": prepare_bytes_decimal(
        d, {"scale": scale, "precision": len(d.as_tuple().digits) + scale})}


def array_literal(items):
    def one(e):
        if e is None:
            return "NULL"
        return '"' + e.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "{" + ",".join(one(e) for e in items) + "}"


def array_of(element):
    """(literal, datums) of a one-dimensional array of ``element``'s (text, datum) with
    NULLs."""
    items = st.lists(st.one_of(st.none(), element), max_size=4)
    return items.map(lambda xs: (array_literal([None if x is None else x[0] for x in xs]),
                                 [None if x is None else x[1] for x in xs]))


# -- the column kinds: (column, strategy of (JSON value, expected datum)) -------------------

def _int_kind(name, lo, hi):
    ints = st.one_of(st.sampled_from([lo, hi, 0, -1, 63, 64, -65]), st.integers(lo, hi))
    # a domain over an integer arrives as its text
    return col("c", name), st.one_of(ints.map(lambda n: (n, n)),
                                     ints.map(lambda n: (str(n), n)))


def _float_kind(name, width):
    finite = st.floats(width=width, allow_nan=False, allow_infinity=False)
    return col("c", name), st.one_of(finite.map(lambda x: (x, x)), NONFINITE)


def _timestamp_kind(draw, name):
    p = draw(st.sampled_from([None, 0, 3, 4, 6]))
    zoned = name == "timestamptz"
    millis = p is not None and p <= 3
    values = timestamps(zoned).map(lambda t: (t[0], in_long(t[1] // 1000 if millis else t[1])))
    return col("c", name, precision=p, typmod=-1 if p is None else p), st.one_of(
        values, st.sampled_from([("infinity", None), ("-infinity", None)]))


@st.composite
def kinds(draw):
    kind = draw(st.sampled_from(["int2", "int4", "int8", "oid", "float4", "float8", "bool",
                                 "numeric", "vsd", "text", "bytea", "uuid", "date",
                                 "timestamp", "timestamptz", "time", "array_int",
                                 "array_numeric", "array_ts3", "array_date", "array_text"]))
    if kind in ("int2", "int4", "int8", "oid"):
        return _int_kind(kind, *{"int2": (-2**15, 2**15 - 1), "int4": (-2**31, 2**31 - 1),
                                 "int8": INT64, "oid": (0, 2**32 - 1)}[kind])
    if kind in ("float4", "float8"):
        return _float_kind(kind, 32 if kind == "float4" else 64)
    if kind == "bool":
        return col("c", "bool"), st.sampled_from([(True, True), (False, False), ("t", True),
                                                  ("f", False)])
    if kind == "numeric":
        p = draw(st.integers(1, 60))
        s = draw(st.integers(-5, p + 3))
        return (col("c", "numeric", precision=p, scale=s, typmod=typmod_numeric(p, s)),
                st.one_of(numerics(p, s), NONFINITE))
    if kind == "vsd":
        return col("c", "numeric"), st.one_of(
            numerics(draw(st.integers(1, 120)), draw(st.integers(0, 60))).map(
                lambda t: (t[0], vsd(t[0]))), NONFINITE)
    if kind == "text":
        text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
        return col("c", "text"), text.map(lambda t: (t, t))
    if kind == "bytea":
        return col("c", "bytea"), st.binary().map(lambda b: ("\\x" + b.hex(), b))
    if kind == "uuid":
        return col("c", "uuid"), st.uuids().map(lambda u: (str(u), str(u)))
    if kind == "date":
        return col("c", "date"), st.one_of(dates(), st.sampled_from([("infinity", None),
                                                                    ("-infinity", None)]))
    if kind in ("timestamp", "timestamptz"):
        return _timestamp_kind(draw, kind)
    if kind == "time":
        p = draw(st.sampled_from([None, 3, 6]))
        unit = 1000 if p is not None and p <= 3 else 1
        tod = st.one_of(st.integers(0, DAY - 1).map(lambda us: (clock(us), us // unit)),
                        st.just(("24:00:00", DAY // unit)))
        return col("c", "time", precision=p, typmod=-1 if p is None else p), tod
    return _array_kind(draw, kind)


def _array_kind(draw, kind):
    if kind == "array_int":
        ints = st.integers(-2**31, 2**31 - 1).map(lambda n: (str(n), n))
        return col("c", "_int4", element="int4"), array_of(ints)
    if kind == "array_numeric":
        p = draw(st.integers(1, 40))
        s = draw(st.integers(0, p))
        return (col("c", "_numeric", element="numeric", typmod=typmod_numeric(p, s)),
                array_of(numerics(p, s)))
    if kind == "array_ts3":
        ts = timestamps(False).map(lambda t: (t[0], t[1] // 1000))
        return col("c", "_timestamp", element="timestamp", typmod=3), array_of(ts)
    if kind == "array_date":
        return col("c", "_date", element="date"), array_of(dates())
    text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
    return col("c", "_text", element="text"), array_of(text.map(lambda t: (t, t)))


@st.composite
def tables(draw):
    """A table (key ``id``, 1–6 generated columns) and 1–3 rows: (JSON row, expected)."""
    picked = draw(st.lists(kinds(), min_size=1, max_size=6))
    columns = [ColumnSchema("id", "int8", 20, key=True)] + [
        msgspec.structs.replace(c, name=f"c{i}") for i, (c, _) in enumerate(picked)]
    rows = []
    for n in range(draw(st.integers(1, 3))):
        values = [draw(strategy) for _, strategy in picked]
        rows.append(({"id": n, **{f"c{i}": v[0] for i, v in enumerate(values)}},
                     {"id": n, **{f"c{i}": v[1] for i, v in enumerate(values)}}))
    return TableSchema("s1", "public", "t", tuple(columns), ("id",), "d"), rows


# -- the check ------------------------------------------------------------------------------

def converted(fmt: AvroFormat, schema: TableSchema, rows) -> tuple[list, dict]:
    """The Avro records of ``rows`` (inserts) and the value schema registered by id."""
    fmt.learn(schema)
    records = [(TOPIC, msgspec.json.encode({"id": json_row["id"]}), msgspec.json.encode(
        {"op": "c", "before": None, "after": json_row, "source": SOURCE, "ts_ms": 17}), None)
        for json_row, _ in rows]
    texts = {}
    try:
        return fmt.convert_all(records), texts
    except SchemasNeeded as need:
        for i, s in enumerate(need.subjects):
            fmt.set_id(s, i + 1)
            texts[i + 1] = s.schema
    return fmt.convert_all(records), texts


def fastavro_body(schema_text: str, datum) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(json.loads(schema_text)), datum)
    return out.getvalue()


def check(fmt: AvroFormat, schema: TableSchema, rows) -> None:
    out, texts = converted(fmt, schema, rows)
    assert len(out) == len(rows)
    for (_, key, value, _), (_, want) in zip(out, rows):
        sid, body = split_header(value)
        envelope = {"before": None, "after": want, "source": SOURCE, "op": "c", "ts_ms": 17,
                    "unchanged_toast": None, "truncate": None, "key_change": None}
        assert body == fastavro_body(texts[sid], envelope), want
        kid, kbody = split_header(key)
        assert kbody == fastavro_body(texts[kid], {"id": want["id"]})


SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.skipif(NATIVE is None, reason="the C accelerator is not built")
@SETTINGS
@given(tables())
def test_the_c_encoder_writes_what_fastavro_writes(table):
    fmt = AvroFormat()
    assert fmt._native is not None
    check(fmt, *table)


@SETTINGS
@given(tables())
def test_the_python_encoder_writes_what_fastavro_writes(table):
    fmt = AvroFormat()
    fmt._native = None
    check(fmt, *table)


@pytest.mark.parametrize("text, days", [
    ("10000-01-01", 2932897), ("0001-12-31 BC", -719163), ("4713-11-24 BC", -2440222),
    ("5874897-12-31", 2145042905), ("0001-02-29 BC", -719469)])
def test_dates_beyond_python_are_days(text, days):
    """The values PostgreSQL itself gives (``date - date '1970-01-01'``)."""
    schema = TableSchema("s1", "public", "t", (ColumnSchema("id", "int8", 20, key=True),
                                               col("d", "date")), ("id",), "d")
    for native in (True, False):
        fmt = AvroFormat()
        if not native:
            fmt._native = None
        check(fmt, schema, [({"id": 1, "d": text}, {"id": 1, "d": days})])


def test_the_reference_agrees_with_python_dates():
    """The reference itself, where Python's date holds the value."""
    for y, m, d in [(1, 1, 1), (1969, 12, 31), (2024, 2, 29), (9999, 12, 31)]:
        assert ref_days(y, m, d) == (dt.date(y, m, d) - EPOCH).days
