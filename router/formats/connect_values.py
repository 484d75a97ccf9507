"""PostgreSQL values as Kafka Connect data (Debezium's mapping), shared by the two formats
that carry them: Kafka Connect's JSON (``router.formats.connect``: bytes as base64) and Avro
(``router.formats.avro_types``: as Confluent's ``AvroData`` writes the same Connect data).

Rules: each function takes a value of pgrouter's JSON envelope (a PostgreSQL text form) and
returns the Connect value, or None where Connect's type cannot hold it (numeric NaN and
±Infinity, a date or timestamp ``infinity``, a timestamp past int64 µs); dates and
timestamps cover PostgreSQL's whole range (``router.postgres.datetimes``). Decimal arithmetic is
exact (``EXACT``). No I/O, no state.
"""

from __future__ import annotations

import datetime as dt
from decimal import Context, Decimal, InvalidOperation

from ..postgres.arrays import array_items
from ..postgres.datetimes import INT32, INT64, days, fits, micros

#: Debezium's value of an unchanged TOAST column in string-like columns (its UTF-8 bytes in
#: bytes columns)
PLACEHOLDER = "__debezium_unavailable_value"
#: exact for every numeric PostgreSQL holds (131072 digits before the point, 16383 after);
#: Python's default context rounds to 28 digits
EXACT = Context(prec=1_000_000, Emax=999_999_999, Emin=-999_999_999)
_NONFINITE = frozenset({"NaN", "Infinity", "-Infinity"})


def unscaled(value, scale: int) -> bytes | None:
    """A numeric at ``scale`` as Connect's ``Decimal``: its unscaled value, big-endian two's
    complement in the fewest bytes; None for what is not a finite number."""
    try:
        d = Decimal(value)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None  # Connect's Decimal has no NaN/Infinity
    n = int(d.scaleb(scale, EXACT).to_integral_value(context=EXACT))
    return n.to_bytes(max(1, (n.bit_length() + 8) // 8), "big", signed=True)


def variable_decimal(value) -> tuple[int, bytes] | None:
    """A numeric without a declared scale as Debezium's ``VariableScaleDecimal``: (its
    scale, ``unscaled`` at that scale); None for what is not a finite number."""
    try:
        d = Decimal(value)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    scale = max(0, -d.as_tuple().exponent)
    return scale, unscaled(value, scale)  # type: ignore[return-value]  # finite: bytes


def float_text(v: str) -> float | None:
    """A float4/float8 text; NaN and ±Infinity (no JSON number, no Connect value) are None."""
    return None if v in _NONFINITE else float(v)


def bytea(v: str) -> bytes:
    """A bytea's bytes: its text form is ``\\x`` and hex (``bytea_output = hex``, the
    default)."""
    return bytes.fromhex(v[2:]) if v.startswith("\\x") else v.encode()


def date(v: str) -> int | None:
    """Days since the epoch (every finite date PostgreSQL holds fits an int32)."""
    return fits(days(v), INT32)


def timestamp(utc: bool, millis: bool):
    """``text -> `` µs (ms) since the epoch: a timestamp as its wall time reads, a
    timestamptz at UTC; None for ±infinity and past int64 (µs from 294247 AD on)."""
    def convert(v: str) -> int | None:
        m = micros(v, utc)
        return None if m is None else fits(m // 1000 if millis else m, INT64)
    return convert


def micro_time(v: str) -> int | None:
    """µs since midnight (``24:00:00`` is a whole day)."""
    if v.startswith("24:"):
        return 86_400_000_000
    try:
        t = dt.time.fromisoformat(v)
    except ValueError:
        return None
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond


def milli_time(v: str) -> int | None:
    """ms since midnight."""
    m = micro_time(v)
    return None if m is None else m // 1000


def array_values(text: str, conv, nested_ok: bool) -> list:
    """The elements of a one-dimensional array literal, each converted by ``conv`` (None
    stays None); an inner array raises ``ValueError`` unless ``nested_ok`` (then it is
    converted from its literal text)."""
    out = []
    for e in parse_array(text):
        if e is None:
            out.append(None)
        elif e[:1] == "{" and not nested_ok:
            raise ValueError("multi-dimensional array")
        else:
            out.append(conv(e))
    return out


def parse_array(text: str) -> list[str | None]:
    """The elements of a one-dimensional PostgreSQL array literal (``{1,"a b",NULL}``);
    nested arrays are returned as their literal text."""
    return array_items(text, nested=True)
