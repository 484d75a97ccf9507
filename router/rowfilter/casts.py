"""Type conversions a filter may use, split the way PostgreSQL splits them.

* implicit coercions (``implicit``) are what operator and function resolution may insert:
  integer widening, integer → numeric → float, float4 → float8, varchar/name/bpchar → text
  (bpchar loses its trailing spaces), date → timestamp;
* explicit casts (``explicit``) add the narrowing ones (with PostgreSQL's range errors and
  rounding: numeric rounds half away from zero, float uses rint), bool ↔ int4, typmods
  (varchar(n), char(n), numeric(p,s)).

Casts PostgreSQL performs through text (``CoerceViaIO``: ``int::text``, ``text::int``) are not
allowed in a publication filter, and casts between timestamp(tz)/date and timestamptz depend on
the session time zone (stable); both raise ``CastRefused``.
"""

from __future__ import annotations

from decimal import Decimal

from . import arith, temporal
from .errors import FilterEvaluationError
from .types import (BOOL, BPCHAR, DATE, FLOAT4, FLOAT8, INT2, INT4, INT8, INTS, NAME, NUMERIC,
                    STRINGS, TEXT, TIMESTAMP, TIMESTAMPTZ, VARCHAR, INT_RANGE, PgType, to_float4)


class CastRefused(Exception):
    def __init__(self, message: str, *, mutable: bool = False):
        self.mutable = mutable
        super().__init__(message)


def _rtrim(s: str) -> str:
    return s.rstrip(" ")


def _widen_check(dst):
    return arith.int_ops(dst)["check"]


def _float4_from_float8(x: float) -> float:
    r = to_float4(x)
    if r in (float("inf"), float("-inf")) and x not in (float("inf"), float("-inf")):
        raise FilterEvaluationError("value out of range: overflow", sqlstate="22003")
    if r == 0.0 and x != 0.0:
        raise FilterEvaluationError("value out of range: underflow", sqlstate="22003")
    return r


def implicit(src: PgType, dst: PgType):
    """Function converting a value of ``src`` to ``dst`` implicitly; ``None`` when the value
    is unchanged; raises LookupError when there is no implicit coercion."""
    if src is dst:
        return None
    if src in INTS and dst in INTS and INTS.index(src) < INTS.index(dst):
        return None
    if src in INTS and dst is NUMERIC:
        return Decimal
    if src in INTS and dst is FLOAT8:
        return float
    if src in INTS and dst is FLOAT4:
        return lambda x: to_float4(float(x))
    if src is NUMERIC and dst in (FLOAT4, FLOAT8):
        return arith.numeric_to_float(dst)
    if src is FLOAT4 and dst is FLOAT8:
        return None
    if src in (VARCHAR, NAME, TEXT) and dst is TEXT:
        return None
    if src is BPCHAR and dst is TEXT:
        return _rtrim
    if src in (VARCHAR, NAME, TEXT) and dst is BPCHAR:
        return None  # binary coercible; bpchar's operators then ignore trailing spaces
    if src is DATE and dst is TIMESTAMP:
        return temporal.date_to_timestamp
    if {src, dst} <= {DATE, TIMESTAMP, TIMESTAMPTZ}:
        raise CastRefused(f"conversion from {src.display} to {dst.display} depends on the "
                          "time zone (not immutable)", mutable=True)
    raise LookupError(f"{src.display} to {dst.display}")


def explicit(src: PgType, dst: PgType, typmod: int = -1):
    """Converter for ``CAST(x AS dst(typmod))`` with ``x`` of type ``src`` (None = unchanged)."""
    base = _explicit_base(src, dst)
    mod = _typmod_fn(dst, typmod)
    if base is None:
        return mod
    if mod is None:
        return base
    return lambda x: mod(base(x))


def _explicit_base(src, dst):
    try:
        return implicit(src, dst)
    except LookupError:
        pass
    if src in INTS and dst in INTS:
        return _widen_check(dst)
    if src is NUMERIC and dst in INTS:
        return arith.numeric_to_int(dst)
    if src in (FLOAT4, FLOAT8) and dst in INTS:
        return arith.float_to_int(dst)
    if src in (FLOAT4, FLOAT8) and dst is NUMERIC:
        return arith.float_to_numeric(src)
    if src is FLOAT8 and dst is FLOAT4:
        return _float4_from_float8
    if src is INT4 and dst is BOOL:
        return lambda x: x != 0
    if src is BOOL and dst is INT4:
        return int
    if src in STRINGS and dst in (VARCHAR, BPCHAR, NAME):
        return _rtrim if src is BPCHAR and dst is not BPCHAR else None
    if src is TIMESTAMP and dst is DATE:
        return temporal.floor_day
    if src in STRINGS or dst in STRINGS:
        raise CastRefused(f"cast from {src.display} to {dst.display} goes through text "
                          "(I/O conversion), which PostgreSQL does not allow in a publication "
                          "row filter")
    raise LookupError(f"cannot cast type {src.display} to {dst.display}")


def _typmod_fn(dst: PgType, typmod: int):
    if typmod < 0:
        return None
    if dst is VARCHAR:
        return lambda s: s[:typmod]
    if dst is BPCHAR:
        return lambda s: s[:typmod].ljust(typmod)
    if dst is NUMERIC:
        return arith.numeric_typmod(typmod)
    return None


__all__ = ["CastRefused", "implicit", "explicit", "INT_RANGE", "INT2", "INT4", "INT8"]
