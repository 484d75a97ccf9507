"""Text-format values → Python, table-driven per type OID."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal

import pytest

from router.formats import values as v
from router.errors import DecodeError
from router.pgoutput import UNCHANGED_TOAST

UTC = dt.timezone.utc


@pytest.mark.parametrize("oid, text, expected", [
    (v.INT2, "-32768", -32768), (v.INT4, "42", 42), (v.INT8, "9223372036854775807", 2**63 - 1),
    (v.OID, "4294967295", 2**32 - 1),
    (v.FLOAT8, "1.5", 1.5), (v.FLOAT4, "-0.25", -0.25),
    (v.FLOAT8, "Infinity", math.inf), (v.FLOAT8, "-Infinity", -math.inf),
    (v.NUMERIC, "12.50", Decimal("12.50")), (v.NUMERIC, "-1e-5", Decimal("-0.00001")),
    (v.NUMERIC, "Infinity", Decimal("Infinity")),
    (v.BOOL, "t", True), (v.BOOL, "f", False),
    (v.TEXT, "héllo", "héllo"), (v.VARCHAR, "x", "x"), (v.BPCHAR, "ab  ", "ab  "),
    (v.NAME, "pg", "pg"),
    (v.BYTEA, "\\xdeadbeef", b"\xde\xad\xbe\xef"), (v.BYTEA, "\\x", b""),
    (v.BYTEA, "a\\\\b\\001", b"a\\b\x01"),
    (v.DATE, "2024-02-29", dt.date(2024, 2, 29)),
    (v.DATE, "infinity", "infinity"), (v.DATE, "0044-03-15 BC", "0044-03-15 BC"),
    (v.TIME, "03:04:05.5", dt.time(3, 4, 5, 500000)), (v.TIME, "24:00:00", "24:00:00"),
    (v.TIMESTAMP, "2024-01-02 03:04:05", dt.datetime(2024, 1, 2, 3, 4, 5)),
    (v.TIMESTAMPTZ, "2024-01-02 03:04:05.123456+00",
     dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)),
    (v.TIMESTAMPTZ, "2024-01-02 03:04:05+05:30",
     dt.datetime(2024, 1, 1, 21, 34, 5, tzinfo=UTC)),
    (v.TIMESTAMPTZ, "infinity", "infinity"), (v.TIMESTAMPTZ, "-infinity", "-infinity"),
    (v.TIMESTAMPTZ, "10000-01-01 00:00:00+00", "10000-01-01 00:00:00+00"),
    (v.INTERVAL, "1 day 02:00:00", "1 day 02:00:00"),
    (v.UUID, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
     uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
    (v.JSON, '{"a": 1}', '{"a": 1}'), (v.JSONB, '{"a": 1}', '{"a": 1}'),
    (1009, "{a,b}", "{a,b}"), (16390, "happy", "happy"),  # array, enum: text
])
def test_converter(oid, text, expected):
    assert v.converter_for(oid)(text) == expected


def test_nan():
    assert math.isnan(v.converter_for(v.FLOAT8)("NaN"))
    assert v.converter_for(v.NUMERIC)("NaN").is_nan()


@pytest.mark.parametrize("oid, text", [
    (v.INT4, "4x"), (v.FLOAT8, "fast"), (v.NUMERIC, "1..2"), (v.BOOL, "true"),
    (v.BYTEA, "\\xzz"), (v.BYTEA, "\\9"), (v.UUID, "nope"),
])
def test_malformed_text_is_a_decode_error(oid, text):
    with pytest.raises(DecodeError):
        v.converter_for(oid)(text)


def test_converter_is_resolved_once():
    assert v.converter_for(v.INT4) is v.converter_for(v.INT8)
    assert v.converter_for(123456)("anything") == "anything"


def test_row_converter_passes_null_toast_and_binary():
    convert = v.row_converter([v.INT4, v.TEXT, v.NUMERIC, v.BYTEA])
    assert convert(("1", None, UNCHANGED_TOAST, b"\x00")) == (1, None, UNCHANGED_TOAST, b"\x00")
    with pytest.raises(DecodeError):
        convert(("1",))
