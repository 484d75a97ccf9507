"""``router._native.AvroConverter`` against its Python reference, ``AvroFormat._convert_all_py``:
the same records (bytes, lists, exceptions) for every column kind, edge value, envelope shape
and byte-level corruption; every plain value PostgreSQL prints is converted by the C itself
(no fallback), and what it declines still converts as Python converts it.

The records are pgrouter's JSON envelopes as ``router.formats.envelope`` writes them (msgspec's
encoding of the envelope dict), some with every non-ASCII character escaped (``\\uXXXX``,
surrogate pairs), as another JSON writer would. The generators are shared with the
differential test of every fast lane (``test_native_twins.py``).
"""

from __future__ import annotations

import collections
import json
import random
import threading

import msgspec
import pytest

from router.formats.avro import AvroFormat, SchemasNeeded
from router.native import NATIVE
from router.formats.schema import ColumnSchema, TableSchema

TOPIC = "app.public.t"
SOURCE = {"db": "shop", "schema": "public", "table": "t", "lsn": 5, "commit_lsn": 6, "seq": 0,
          "xid": 9, "commit_time": "2024-01-02T03:04:05.000001Z", "origin": None,
          "origin_lsn": None, "route": "app", "schema_id": "s1"}
SEED = 2026


def col(name, type_, key=False, precision=None, scale=None, element=None):
    return ColumnSchema(name, type_, 0, key=key, precision=precision, scale=scale,
                        element=element)


DIGITS28 = "1234567890123456789012345678"
# (column, plain values the C converts itself, odd values it may leave to Python)
KINDS = {
    "int8": (col("i8", "int8"), [0, 1, -1, 63, 64, -64, -65, 8191, 8192, 2**31 - 1, -2**31,
                                 2**63 - 1, -2**63, 4294967295],
             [2**63, -2**63 - 1, 2**64, 1.5, True, "12", "x"]),
    "int2": (col("i2", "int2"), [-32768, 32767, 0], ["7", 1e5]),
    "int4": (col("i4", "int4"), [2147483647, -2147483648, 5], [3.0]),
    "oid": (col("o", "oid"), [4294967295, 0], ["1"]),
    "float4": (col("f4", "float4"), [1.5, -0.0, 0.0, 3.4028234663852886e38, 1e-45, 0.1, 3,
                                     -7, "NaN", "Infinity", "-Infinity", 2**70, 1e-300],
               [1e39, 3.5e38, "1.5", "nan", "x", True]),
    "float8": (col("f8", "float8"), [-2.25e300, 5e-324, 1.7976931348623157e308 / 2, -0.0, 1,
                                     "NaN", 0.30000000000000004, 2**64, 10**20],
               ["Infinity ", "1", 1.7976931348623157e308, False]),
    "bool": (col("b", "bool"), [True, False], ["t", "f", 1, None]),
    "text": (col("t", "text"), ["", "abc", "hé \u2603", "emoji 😀 𝄞", '"q" \\ /',
                                "\n\t\x00\x01\x1f\x7f", "\u2028\u2029", "x" * 300,
                                "__debezium_unavailable_value", "\ufeff"],
             [5, 1.5, True, ["a"], {"a": 1}]),
    "varchar": (col("vc", "varchar", precision=3), ["abc"], []),
    "uuid": (col("u", "uuid"), ["6ba7b810-9dad-11d1-80b4-00c04fd430c8"], []),
    "json": (col("j", "jsonb"), ['{"a": [1, 2]}', "null"], [{"a": 1}]),
    "timetz": (col("ttz", "timetz"), ["13:14:15+02"], []),
    "interval": (col("iv", "interval"), ["1 day 02:00:00"], []),
    "bytea": (col("by", "bytea"), ["\\x", "\\x00ff10", "\\xABcdEF", "plain text", "é",
                                   "\\", "\\X00"],
              ["\\x0", "\\x00 ff", "\\xzz", "\\x 00", 5]),
    "numeric": (col("n", "numeric", precision=12, scale=2),
                ["0.00", "-0.00", "1.50", "-12345678.90", "9999999999.99", "-1.28", "1.27",
                 "-1.27", "-0.01", "327.68", "-327.68", "1.5", "7", "NaN", "Infinity",
                 "-Infinity", "00012.30"],
                ["1.555", "1e5", " 1.00", "abc", "+1.00", ".5", "5.", "1_000.00", 1.5, 7,
                 "-", "", "1.2.3", "sNaN", "inf"]),
    "numeric_neg": (col("nneg", "numeric", precision=5, scale=-2), ["1234500", "-100", "0"],
                    ["12.5"]),
    "numeric_wide": (col("nw", "numeric", precision=38, scale=10),
                     ["0.0000000001", "-" + DIGITS28[:18] + ".0000000000",
                      DIGITS28[:19] + ".5", "-" + DIGITS28, DIGITS28[:18] + "." + DIGITS28[:10],
                      "-9223372036854775808", "9223372036854775807.000000001",
                      DIGITS28 + ".0000000000", "-9223372036854775807.0000000001",
                      "9" * 28 + "." + "9" * 10],
                     # more than 38 digits unscaled: past an __int128, Python's
                     [DIGITS28 + "9.0", "1" + DIGITS28 + ".5", DIGITS28 + "12.1",
                      "12345678901234567890123456789012.5", "1" * 39]),
    "vsd": (col("v", "numeric"),
            ["0", "-0.00123", "123.4500", "0.000", "-" + DIGITS28, DIGITS28[:20] + "." +
             DIGITS28[:8], "NaN", "-Infinity", "1" + "0" * 27, DIGITS28 + "9",
             "0." + DIGITS28 + "9", "1" + "0" * 37, "-" + "9" * 38, "0." + "0" * 40 + "1"],
            ["1e5", "1E-3", "1" * 39, "0." + "1" * 39, 12]),
    "date": (col("d", "date"), ["2024-02-29", "1970-01-01", "1969-12-31", "0001-01-01",
                                "9999-12-31", "2000-02-29", "1900-03-01", "infinity",
                                "-infinity"],
             ["0044-03-15 BC", "2023-02-29", "20240229", "2024-1-02", "10000-01-01",
              "2024-02-29 ", "1900-02-29", "0000-01-01", "2024-W01-1"]),
    "timestamp": (col("ts", "timestamp"),
                  ["2024-01-02 03:04:05", "2024-01-02 03:04:05.123456", "2024-01-02 03:04:05.5",
                   "1969-12-31 23:59:59.999999", "0001-01-01 00:00:00",
                   "9999-12-31 23:59:59.999999", "2024-02-29 12:00:00.01", "infinity",
                   "-infinity", "2024-01-02T03:04:05"],
                  ["2024-01-02 03:04:05.1234567", "2024-01-02 03:04:05+02",
                   "2024-01-02 03:04", "2024-01-02 24:00:00", "2024-01-02 03:04:60",
                   "0044-03-15 01:02:03 BC", "2024-01-02", "2024-01-02 03:04:05.",
                   "12024-01-02 03:04:05"]),
    "timestamp3": (col("ts3", "timestamp", precision=3),
                   ["1969-12-31 23:59:59.999", "1969-12-31 23:59:59.9995", "2024-01-02 03:04:05",
                    "1969-12-31 23:59:59.0001"], []),
    "timestamptz": (col("tz", "timestamptz"),
                    ["2024-01-02 03:04:05.5+02", "2024-01-02 03:04:05+05:30",
                     "2026-11-22 00:00:00.123+00", "1969-12-31 23:59:59.5-01",
                     "1900-01-01 00:00:00+00:53:28", "1900-01-01 00:00:00-00:25:21",
                     "2024-02-29 23:30:00-14", "2024-01-02 03:04:05", "infinity",
                     "-infinity", "0002-01-01 00:00:00+00", "9998-12-31 23:59:59+00"],
                    ["0001-01-01 00:00:00+00", "0001-01-01 00:30:00+01",
                     "9999-12-31 23:59:59-01", "9999-12-31 23:00:00+00", "2024-01-02 03:04:05Z",
                     "2024-01-02 03:04:05+0530", "2024-01-02 03:04:05+5",
                     "2024-01-02 03:04:05+05:30:15.5", "2024-01-02 03:04:05 +02"]),
    "timestamptz3": (col("tz3", "timestamptz", precision=3),
                     ["2024-01-02 03:04:05.1239+02", "1969-12-31 23:59:59.9999+00"], []),
    "time": (col("tm", "time"), ["00:00:00", "13:14:15.000016", "23:59:59.999999", "24:00:00",
                                 "13:14:15.5"],
             ["13:14", "25:00:00", "13:14:15.1234567", "24:", "24:00:00.5", "1:02:03",
              "13:14:15+02"]),
    "time3": (col("tm3", "time", precision=3), ["13:14:15.5", "00:00:00.0009", "24:00:00"], []),
    "array": (col("ai", "_int4", element="int4"), [], ["{1,NULL,-3}", "{}"]),
}
ASTRAL = "😀 𝄞 \U0010ffff"


def table(columns, key=("id",), schema_id="s1"):
    return TableSchema(schema_id, "public", "t", tuple(columns), tuple(key), "d")


ALL = table([col("id", "int8", key=True), col("ké", "text", key=True)]
            + [c for c, _, _ in KINDS.values()], key=("id", "ké"))
KEYLESS = table([col("x", "text"), col("n1", "numeric", precision=5, scale=1)], key=(),
                schema_id="s2")
WIDE_KEY = table([col("k", "numeric", precision=12, scale=2, key=True),
                  col("kt", "timestamptz", key=True), col("x", "text")],
                 key=("k", "kt"), schema_id="s3")
TABLES = (ALL, KEYLESS, WIDE_KEY)


class Ids:
    """Registry ids by (subject, schema text), the same for every format."""

    def __init__(self):
        self.ids: dict[tuple[str, str], int] = {}

    def ready(self, fmt: AvroFormat, records: list) -> None:
        for _ in range(3):
            try:
                fmt._convert_all_py(records)
                return
            except SchemasNeeded as need:
                for s in need.subjects:
                    fmt.set_id(s, self.ids.setdefault((s.subject, s.schema), len(self.ids) + 1))


def envelope(op="c", before=None, after=None, *, toast=None, truncate=None, source=None,
             ts_ms=17):
    value = {"op": op, "before": before, "after": after, "source": source or SOURCE,
             "ts_ms": ts_ms}
    if toast is not None:
        value["unchanged_toast"] = toast
    if truncate is not None:
        value["truncate"] = truncate
    return value


def encode(obj, escaped=False) -> bytes:
    """msgspec's JSON (pgrouter's) or JSON with every non-ASCII character escaped."""
    if escaped:
        return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode()
    return msgspec.json.encode(obj)


def schema_of(schema_id) -> TableSchema:
    return next(t for t in TABLES if t.schema_id == schema_id)


def record(value: dict, key=None, topic=TOPIC, escaped=False):
    return (topic, None if key is None else encode(key, escaped), encode(value, escaped),
            [("h", b"1")])


def key_of(schema: TableSchema, row: dict | None):
    if not schema.key_columns:
        return None
    return {k: (row or {}).get(k) for k in schema.key_columns}


def formats(converter=None):
    """A format with every table's plan made (a first record of each converted in Python,
    its ids set), and ``converter`` (a fresh ``AvroConverter``) as its fast lane if given."""
    fmt, ids = AvroFormat(), Ids()
    if converter is not None:
        fmt._native = converter
    first = {"s1": {"id": 1, "ké": "k"}, "s2": {"x": "a"},
             "s3": {"k": "1.00", "kt": "2024-01-01 00:00:00+00"}}
    for schema in TABLES:
        fmt.learn(schema)
        row = first[schema.schema_id]
        ids.ready(fmt, [record(envelope(after=row, source=dict(SOURCE,
                                                               schema_id=schema.schema_id)),
                               key_of(schema, row))])
    return fmt


def outcome(fn, records):
    try:
        return ("ok", fn(records))
    except Exception as exc:  # the exception's type is the outcome to compare
        return ("raised", type(exc).__name__)


def run_native(converter, fmt, records):
    """(outcome, the records the C declined) of ``converter.convert_all``."""
    declined, missing = [], []

    def fallback(rec):
        declined.append(rec)
        return fmt.convert(rec, missing)

    def convert(recs):
        out = converter.convert_all(recs, fallback)
        if missing:
            raise SchemasNeeded(missing)
        return out
    return outcome(convert, records), declined


def compare(fmt, records, converter=None):
    """The C's outcome equals Python's; returns the records the C declined."""
    got, declined = run_native(converter or fmt._native, fmt, records)
    want = outcome(fmt._convert_all_py, records)
    assert got == want, records
    return declined


# -- generated records ----------------------------------------------------------------------

def rand_text(rng):
    alphabet = "ab \"\\/\n\t\x00\x1f\x7fé☃\u2028😀𝄞\U0010ffff"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))


def rand_plain(rng, name):
    """A plain value of column ``name``'s kind: from its pool or made at random."""
    c, plain, _ = KINDS[name]
    r = rng.random()
    if r < 0.5 or name in ("bool", "varchar", "uuid", "json", "timetz", "interval", "array"):
        return rng.choice(plain) if plain else None
    if name in ("int8", "oid"):
        return rng.randint(-2**63, 2**63 - 1) if name == "int8" else rng.randint(0, 2**32 - 1)
    if name in ("int2", "int4"):
        return rng.randint(-2**15, 2**15 - 1)
    if name in ("float4", "float8"):
        return rng.choice([rng.uniform(-1, 1) * 10 ** rng.randint(-40, 38),
                           float(rng.randint(-10**6, 10**6)), rng.randint(-10**20, 10**20)])
    if name == "text":
        return rand_text(rng)
    if name == "bytea":
        return "\\x" + rng.randbytes(rng.randint(0, 40)).hex()
    if name.startswith("numeric") or name == "vsd":
        scale = {"numeric": 2, "numeric_neg": 0, "numeric_wide": 10}.get(name, rng.randint(0, 9))
        return rand_numeric(rng, scale, 38 - scale if name != "numeric" else 10)
    days = rng.randint(-719162, 2932896)  # 0001-01-01 .. 9999-12-31
    import datetime as dt
    d = dt.datetime(1970, 1, 1) + dt.timedelta(days=days, microseconds=rng.randint(0, 86399999999))
    us = d.microsecond
    frac = rng.choice(["", f".{us:06d}", f".{us:06d}".rstrip("0") if us else ""])
    if name == "date":
        return d.date().isoformat()
    if name.startswith("time") and not name.startswith("timestamp"):
        return d.time().replace(microsecond=0).isoformat() + frac
    text = d.replace(microsecond=0).isoformat(" ") + frac
    if name.startswith("timestamptz") and rng.random() < 0.9 and 1 < d.year < 9999:
        off = rng.randint(-15 * 3600, 15 * 3600)
        sign, off = ("-" if off < 0 else "+"), abs(off)
        text += f"{sign}{off // 3600:02d}" + rng.choice(["", f":{off // 60 % 60:02d}",
                                                           f":{off // 60 % 60:02d}:{off % 60:02d}"])
    return text


def rand_numeric(rng, scale: int, digits: int) -> str:
    n = rng.randint(-10**rng.randint(1, digits) + 1, 10**digits - 1)
    text = f"{abs(n) // 10**scale}" + (f".{abs(n) % 10**scale:0{scale}d}" if scale else "")
    return ("-" if n < 0 else "") + text


def rand_key_time(rng) -> str:
    text = rand_plain(rng, "timestamptz")
    return "2024-01-01 00:00:00+00" if "infinity" in text else text  # a key is never null


def rand_row(rng, schema, odd: bool, key_only=False):
    row = {}
    for c in schema.columns:
        if key_only and not c.key:
            continue
        r = rng.random()
        if r < 0.08 and not c.key:
            continue  # absent: null
        if r < 0.18 and not c.key:
            row[c.name] = None
            continue
        name = next((n for n, (kc, _, _) in KINDS.items() if kc.name == c.name), None)
        if name is None:  # the key columns and the other tables'
            row[c.name] = (rng.randint(-5, 5) if c.type == "int8" else
                           rand_numeric(rng, c.scale, 10) if c.type == "numeric" else
                           rand_key_time(rng) if c.type == "timestamptz" else
                           rng.choice(["a", "é", "", ASTRAL]))
        elif odd and rng.random() < 0.15 and KINDS[name][2]:
            row[c.name] = rng.choice(KINDS[name][2])
        else:
            row[c.name] = rand_plain(rng, name)
    if odd and rng.random() < 0.2:
        names = list(row)
        rng.shuffle(names)  # another member order: C still reads it
        row = {n: row[n] for n in names}
    if key_only:
        row = {k: v for k, v in row.items() if v is not None}
    return row


def rand_record(rng, odd: bool, escaped: float = 0.2):
    schema = rng.choice(TABLES)
    source = dict(SOURCE, schema_id=schema.schema_id, lsn=rng.randint(0, 2**63 - 1),
                  seq=rng.randint(0, 2**40), origin=rng.choice([None, "o", "ü"]),
                  origin_lsn=rng.choice([None, 0, 2**62]), route=rng.choice(["app", ASTRAL]))
    op = rng.choice("ccccuuudrt")
    before = after = toast = truncate = None
    if op in "cru":
        after = rand_row(rng, schema, odd)
    if op == "u" and rng.random() < 0.5 or op == "d":
        before = rand_row(rng, schema, odd, key_only=rng.random() < 0.5)
        if after is not None and rng.random() < 0.8:  # mostly the same key
            before.update({k: after[k] for k in schema.key_columns})
    if op == "u" and rng.random() < 0.3:
        toast = [c.name for c in schema.columns if not c.key and rng.random() < 0.3]
        for name in toast:
            if rng.random() < 0.9:
                after.pop(name, None)
    if op == "t":
        truncate = {"cascade": rng.random() < 0.5, "restart_identity": rng.random() < 0.5}
    value = envelope(op, before, after, toast=toast, truncate=truncate, source=source,
                     ts_ms=rng.choice([17, None, -1, 2**62]))
    key = None if op == "t" else key_of(schema, after if after is not None else before)
    rec = record(value, key, escaped=rng.random() < escaped)
    if op == "t" or not schema.key_columns:
        rec = (rec[0], b"null", rec[2], rec[3])
    if odd and rng.random() < 0.3:
        rec = corrupt(rng, rec)
    return rec


def corrupt(rng, rec):
    topic, key, value, headers = rec
    data = bytearray(value)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(data))
        r = rng.random()
        if r < 0.4:
            data[i] = rng.choice(b'{}[]":,\\0123456789-.eEtfnul x\x00\xff\xc3')
        elif r < 0.7:
            del data[i]
        else:
            data[i:i] = rng.choice([b",", b" ", b'"', b"\\u00e9", b"\\ud800", b"0"])
    return (topic, key, bytes(data), headers)


def rand_case(rng):
    odd = rng.random() < 0.2
    return [rand_record(rng, odd, escaped=0.03) for _ in range(rng.randint(1, 3))]


# -- tests ----------------------------------------------------------------------------------

needs_native = pytest.mark.skipif(NATIVE is None, reason="router._native off")


@pytest.fixture
def fmt():
    return formats()


def one_column(schema_id: str, name: str, value) -> tuple:
    row = {"id": 1, "ké": "k", name: value}
    return record(envelope(after=row, source=dict(SOURCE, schema_id=schema_id)),
                  {"id": 1, "ké": "k"})


@needs_native
@pytest.mark.parametrize("name", KINDS)
def test_every_plain_value_is_converted_by_the_c_as_python_converts_it(fmt, name):
    c, plain, odd = KINDS[name]
    records = [one_column("s1", c.name, v) for v in plain + [None]]
    assert compare(fmt, records) == []
    for v in odd:  # may be declined; converts (or fails) as Python does either way
        compare(fmt, [one_column("s1", c.name, v)])


@needs_native
def test_a_whole_row_escaped_and_in_another_member_order(fmt):
    row = {"id": -2**63, "ké": ASTRAL, **{c.name: plain[-1] for c, plain, _ in KINDS.values()
                                          if plain}}
    value = envelope("r", after=dict(reversed(row.items())))
    recs = [record(value, {"ké": ASTRAL, "id": -2**63})]
    assert compare(fmt, recs) == []
    # escaped, the column "ké" is not spelled as the plan has it: declined, still the same
    escaped = record(value, {"id": 1, "ké": "x"}, escaped=True)
    assert compare(fmt, [escaped]) == [escaped]
    # escaped strings in values, the column names as pgrouter spells them: the C's
    text = envelope(after={"id": 1, "ké": "k", "t": ASTRAL + "\u2603\x00\"\\/é"})
    value = encode(text, escaped=True).replace(b'"k\\u00e9":', '"ké":'.encode())
    assert b"\\ud83d" in value
    assert compare(fmt, [(TOPIC, b'{"id":1,"k\xc3\xa9":"k"}', value, None)]) == []


@needs_native
@pytest.mark.parametrize("raw", [b'"\\ud83d\\ude00"', b'"\\uD834\\uDD1E x"', b'"\\u00e9\\/"',
                                 b'"\\ud800"', b'"\\udc00"', b'"\\ud800\\u0041"', b'"\\x"',
                                 b'"\xff"', b'"\xed\xa0\x80"', b'"\xc0\xaf"', b'"\xf4\x90\x80\x80"',
                                 b'"a\x01"', b'"\\u12"'])
def test_escapes_and_utf8_as_msgspec_reads_them(fmt, raw):
    value = encode(envelope(after={"id": 1, "ké": "k", "t": "PLACE"})).replace(b'"PLACE"', raw)
    rec = (TOPIC, b'{"id":1,"k\xc3\xa9":"k"}', value, None)
    declined = compare(fmt, [rec])
    assert (declined == []) is (raw in (b'"\\ud83d\\ude00"', b'"\\uD834\\uDD1E x"',
                                        b'"\\u00e9\\/"'))


@needs_native
def test_unchanged_toast_truncates_keyless_tables_and_what_stays_python(fmt):
    toasted = record(envelope("u", before={"id": 1, "ké": "k"}, after={"id": 1, "ké": "k"},
                              toast=["t", "by", "j", "ai", "d"]), {"id": 1, "ké": "k"})
    empty = record(envelope("u", after={"id": 1, "ké": "k", "t": "x"}, toast=[]),
                   {"id": 1, "ké": "k"})
    trunc = (TOPIC, b"null", encode(envelope("t", truncate={"cascade": True,
                                                            "restart_identity": False})), None)
    keyless = (TOPIC, b"null", encode(envelope("d", before={"x": "gone", "n1": "1.5"},
                                               source=dict(SOURCE, schema_id="s2"))), None)
    assert compare(fmt, [toasted, empty, trunc, keyless]) == []
    key_change = record(envelope("u", before={"id": 1, "ké": "k"}, after={"id": 2, "ké": "k"}),
                        {"id": 2, "ké": "k"})
    toast_with_value = record(envelope("u", after={"id": 1, "ké": "k", "t": "x"}, toast=["t"]),
                              {"id": 1, "ké": "k"})
    unknown_toast = record(envelope("u", after={"id": 1, "ké": "k"}, toast=["nope"]),
                           {"id": 1, "ké": "k"})
    meta = ("tx", b'"1:2"', b'{"status":"BEGIN","id":"1:2","event_count":null}', None)
    message = ("msgs", None, encode({"op": "m", "before": None, "after": None,
                                     "source": dict(SOURCE, schema_id=None), "ts_ms": 3,
                                     "message": {"prefix": "p", "transactional": True,
                                                 "content": "aGk="}}), None)
    array = record(envelope(after={"id": 1, "ké": "k", "ai": "{1,2}"}), {"id": 1, "ké": "k"})
    null_key = record(envelope(after={"id": None, "ké": "k"}), {"id": None, "ké": "k"})
    declined = [key_change, toast_with_value, meta, array]
    assert compare(fmt, declined) == declined
    for failing in (unknown_toast, null_key):  # Python raises
        assert compare(fmt, [failing]) == [failing]
    fmt.learn(table([col("id", "int8", key=True)], schema_id="s9"))
    first = record(envelope(after={"id": 1}, source=dict(SOURCE, schema_id="s9")), {"id": 1})
    assert outcome(fmt.convert_all, [first]) == ("raised", "SchemasNeeded")
    assert compare(fmt, [message]) == [message]  # the message schema has no id either


@needs_native
def test_random_records_convert_as_python_converts_them():
    fmt = formats()
    rng = random.Random(SEED)
    verdicts = collections.Counter()
    for _ in range(3000):
        rec = rand_record(rng, odd=rng.random() < 0.3)
        declined = compare(fmt, [rec])
        verdicts["declined" if declined else "native"] += 1
    assert verdicts["native"] > 1500, verdicts


@needs_native
def test_random_batches_keep_their_order_with_declined_records_between():
    fmt = formats()
    rng = random.Random(SEED + 1)
    for _ in range(200):
        compare(fmt, [rand_record(rng, odd=rng.random() < 0.2) for _ in range(rng.randint(0, 30))])


@needs_native
def test_large_batches_convert_without_the_gil_as_python_converts_them():
    """From 64 records on the C converts without the GIL, up to each declined record; a plan
    the fallback makes (a table's first record) is found by the records after it."""
    rng = random.Random(SEED + 3)
    for i in range(12):
        fmt = formats()
        if i % 2:  # no plan yet: the first record of each table makes it, mid-batch
            fmt._native, fmt._tables = NATIVE.AvroConverter(), {}
        # (no odd records: the first that Python refuses would end the batch)
        batch = [rand_record(rng, odd=False) for _ in range(rng.randint(64, 400))]
        declined = compare(fmt, batch)
        assert len(declined) < len(batch) / 2, (i, len(declined), len(batch))  # C did most


@needs_native
def test_threads_converting_at_once_get_what_one_gets_alone():
    """One converter, four threads: each batch converts as it does alone (the plans' scratch
    is taken by one call at a time)."""
    fmt = formats()
    rng = random.Random(SEED + 4)
    batches = [[rand_record(rng, odd=False) for _ in range(200)] for _ in range(8)]
    want = [outcome(fmt._convert_all_py, batch) for batch in batches]
    got: dict = {}

    def work(k):
        got[k] = [outcome(fmt.convert_all, batch) for batch in batches[k::4]]
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(4):
        assert got[k] == want[k::4]


def test_the_python_path_alone_converts_the_same(fmt, monkeypatch):
    """``convert_all`` without the accelerator is ``_convert_all_py``."""
    rng = random.Random(SEED + 2)
    records = [rand_record(rng, odd=False) for _ in range(50)]
    want = outcome(fmt._convert_all_py, records)
    monkeypatch.setattr(fmt, "_native", None)
    assert outcome(fmt.convert_all, records) == want


# -- the lane of test_native_twins.py -------------------------------------------------------

def check_avro(python, fast, records):
    fmt = formats(fast())
    got, declined = run_native(fmt._native, fmt, records)
    assert got == outcome(lambda recs: python(fmt, recs), records)
    return "declined" if declined else "same"


def golden_avro():
    plain = [one_column("s1", c.name, v) for c, values, _ in KINDS.values() for v in values]
    key = {"id": 1, "ké": "k"}
    shapes = [record(envelope("u", before=key, after=key, toast=["t", "by", "ai"]), key),
              record(envelope("d", before={**key, "t": "x"}), key),
              (TOPIC, b"null", encode(envelope("t", truncate={"cascade": False,
                                                              "restart_identity": True})), None),
              (TOPIC, b"null", encode(envelope("r", after={"x": "a", "n1": "-0.5"},
                                               source=dict(SOURCE, schema_id="s2"))), None)]
    new_key = {"id": 2, "ké": "k"}
    key_change = record(envelope("u", before=key, after=new_key), new_key)
    meta = ("tx", b'"1:2"', b'{"status":"BEGIN","id":"1:2","event_count":null}', None)
    return [("same", plain), ("same", shapes), ("same", []),
            ("declined", [one_column("s1", "ai", "{1}")]),
            ("declined", [one_column("s1", "n", "1.555")]), ("declined", [key_change, meta])]


def gen_avro(rng):
    return rand_case(rng)
