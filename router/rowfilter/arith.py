"""Operators with PostgreSQL's semantics: integer overflow raises, integer division truncates
toward zero, numeric division picks PostgreSQL's result scale, float arithmetic reports
overflow/underflow, NaN equals NaN and sorts above everything, ``bpchar`` ignores trailing
spaces, LIKE has ``%``/``_`` and a backslash escape, ILIKE folds ASCII only (collation "C").
"""

from __future__ import annotations

import math
import operator
import re
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from functools import lru_cache

from .errors import FilterEvaluationError, division_by_zero, out_of_range
from .types import BPCHAR, FLOAT4, FLOAT8, INT2, INT4, INT8, INT_RANGE, NUMERIC, to_float4

CTX = Context(prec=1_000_000, Emax=999_999_999, Emin=-999_999_999, traps=[],
              rounding=ROUND_HALF_UP)
NAN = Decimal("NaN")
_OUT_OF_RANGE_NAME = {INT2: "smallint", INT4: "integer", INT8: "bigint"}


# --- integers ------------------------------------------------------------------------------

def int_ops(typ):
    lo, hi = INT_RANGE[typ]
    err = _OUT_OF_RANGE_NAME[typ]

    def check(v):
        if lo <= v <= hi:
            return v
        raise out_of_range(err)

    def add(x, y):
        return check(x + y)

    def sub(x, y):
        return check(x - y)

    def mul(x, y):
        return check(x * y)

    def div(x, y):
        if y == 0:
            raise division_by_zero()
        q = abs(x) // abs(y)
        return check(q if (x < 0) == (y < 0) else -q)

    def mod(x, y):
        if y == 0:
            raise division_by_zero()
        r = abs(x) % abs(y)
        return -r if x < 0 else r

    def neg(x):
        return check(-x)

    return {"+": add, "-": sub, "*": mul, "/": div, "%": mod, "neg": neg, "abs": lambda x: check(abs(x)),
            "check": check}


# --- numeric -------------------------------------------------------------------------------

def _div_scale(x: Decimal, y: Decimal) -> int:
    """PostgreSQL's select_div_scale(): at least 16 significant digits, never less than
    either input's display scale."""
    def weight_digit(d: Decimal):
        if d.is_zero():
            return 0, 0
        e = d.adjusted()
        w = e // 4
        return w, int(abs(d).scaleb(-4 * w, CTX))
    w1, d1 = weight_digit(x)
    w2, d2 = weight_digit(y)
    qweight = w1 - w2 - (1 if d1 <= d2 else 0)
    rscale = 16 - qweight * 4
    rscale = max(rscale, dscale(x), dscale(y), 0)
    return min(rscale, 1000)


def dscale(d: Decimal) -> int:
    return max(0, -d.as_tuple().exponent) if d.is_finite() else 0


def _round_div(num: int, den: int) -> int:
    """num / den rounded half away from zero."""
    q, r = divmod(abs(num), abs(den))
    if 2 * r >= abs(den):
        q += 1
    return q if (num < 0) == (den < 0) else -q


def num_div(x: Decimal, y: Decimal) -> Decimal:
    if x.is_nan() or y.is_nan():
        return NAN
    if y.is_zero():
        raise division_by_zero()
    if x.is_infinite():
        if y.is_infinite():
            return NAN
        return x if y > 0 else -x
    if y.is_infinite():
        return Decimal(0)
    rscale = _div_scale(x, y)
    sx, dx, ex = x.as_tuple()
    sy, dy, ey = y.as_tuple()
    mx = int("".join(map(str, dx))) * (-1 if sx else 1)
    my = int("".join(map(str, dy))) * (-1 if sy else 1)
    # x / y = mx/my * 10^(ex-ey); scaled by 10^rscale
    shift = ex - ey + rscale
    if shift >= 0:
        q = _round_div(mx * 10 ** shift, my)
    else:
        q = _round_div(mx, my * 10 ** (-shift))
    return Decimal(q).scaleb(-rscale, CTX)


def num_mod(x: Decimal, y: Decimal) -> Decimal:
    if x.is_nan() or y.is_nan():
        return NAN
    if y.is_zero():
        raise division_by_zero()
    if x.is_infinite():
        return NAN
    if y.is_infinite():
        return x
    return CTX.remainder(x, y)


def _num_add(x, y):
    return CTX.add(x, y)


def _num_sub(x, y):
    return CTX.subtract(x, y)


def _num_mul(x, y):
    return CTX.multiply(x, y)


NUMERIC_OPS = {"+": _num_add, "-": _num_sub, "*": _num_mul, "/": num_div, "%": num_mod,
               "neg": lambda x: CTX.minus(x), "abs": lambda x: CTX.abs(x)}


def round_numeric(x: Decimal, scale: int = 0) -> Decimal:
    if not x.is_finite():
        return x
    q = x.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP, context=CTX)
    if scale < 0:
        q = q.quantize(Decimal(1), context=CTX)
    return q


def numeric_to_int(typ):
    check = int_ops(typ)["check"]
    err = _OUT_OF_RANGE_NAME[typ]

    def conv(x: Decimal) -> int:
        if x.is_nan():
            raise FilterEvaluationError(f"cannot convert NaN to {err}", sqlstate="0A000")
        if x.is_infinite():
            raise FilterEvaluationError(f"cannot convert infinity to {err}", sqlstate="0A000")
        return check(int(round_numeric(x)))
    return conv


def numeric_typmod(typmod: int):
    """Cast to numeric(p, s): round to s digits, error if more than p - s integer digits."""
    precision, scale = typmod >> 16, typmod & 0xFFFF
    if scale > 0x7FFF:
        scale -= 0x10000
    limit = Decimal(10) ** (precision - scale)

    def conv(x: Decimal) -> Decimal:
        if x.is_nan():
            return x
        if x.is_infinite():
            raise FilterEvaluationError("numeric field overflow", sqlstate="22003")
        r = round_numeric(x, scale)
        if abs(r) >= limit:
            raise FilterEvaluationError("numeric field overflow", sqlstate="22003")
        return r
    return conv


# --- floats --------------------------------------------------------------------------------

_INF = float("inf")


def _overflow():
    return FilterEvaluationError("value out of range: overflow", sqlstate="22003")


def _underflow():
    return FilterEvaluationError("value out of range: underflow", sqlstate="22003")


def float_ops(typ):
    rnd = to_float4 if typ is FLOAT4 else float

    def add(x, y):
        r = rnd(x + y)
        if r in (_INF, -_INF) and x not in (_INF, -_INF) and y not in (_INF, -_INF):
            raise _overflow()
        return r

    def sub(x, y):
        r = rnd(x - y)
        if r in (_INF, -_INF) and x not in (_INF, -_INF) and y not in (_INF, -_INF):
            raise _overflow()
        return r

    def mul(x, y):
        r = rnd(x * y)
        if r in (_INF, -_INF) and x not in (_INF, -_INF) and y not in (_INF, -_INF):
            raise _overflow()
        if r == 0.0 and x != 0.0 and y != 0.0:
            raise _underflow()
        return r

    def div(x, y):
        if y == 0.0 and x == x:
            raise division_by_zero()
        if y == 0.0:
            return x
        r = rnd(x / y)
        if r in (_INF, -_INF) and x not in (_INF, -_INF):
            raise _overflow()
        if r == 0.0 and x != 0.0 and y not in (_INF, -_INF):
            raise _underflow()
        return r

    return {"+": add, "-": sub, "*": mul, "/": div, "neg": operator.neg, "abs": abs}


def float_to_int(typ):
    lo, hi = INT_RANGE[typ]
    err = _OUT_OF_RANGE_NAME[typ]

    def conv(x: float) -> int:
        if x != x or x in (_INF, -_INF):
            raise out_of_range(err)
        v = round(x)  # rint(): half to even
        if not lo <= v <= hi:
            raise out_of_range(err)
        return v
    return conv


def float_to_numeric(typ):
    digits = 6 if typ is FLOAT4 else 15  # FLT_DIG / DBL_DIG, as float8_numeric() prints

    def conv(x: float) -> Decimal:
        if x != x:
            return NAN
        if x in (_INF, -_INF):
            return Decimal(x)
        from .types import normalize_numeric
        return normalize_numeric(Decimal("%.*g" % (digits, x)))
    return conv


def numeric_to_float(typ):
    def conv(x: Decimal) -> float:
        v = float(x)
        if typ is FLOAT4:
            r = to_float4(v)
            if r in (_INF, -_INF) and v not in (_INF, -_INF):
                raise out_of_range("real")
            return r
        if v in (_INF, -_INF) and not x.is_infinite():
            raise out_of_range("double precision")
        return v
    return conv


# --- comparison ------------------------------------------------------------------------------

_PLAIN = {"=": operator.eq, "<>": operator.ne, "<": operator.lt, "<=": operator.le,
          ">": operator.gt, ">=": operator.ge}


def _f_eq(x, y):
    return x == y or (x != x and y != y)


def _f_lt(x, y):
    return x < y or (y != y and x == x)


def _f_le(x, y):
    return x <= y or y != y


_FLOAT = {"=": _f_eq, "<>": lambda x, y: not _f_eq(x, y), "<": _f_lt, "<=": _f_le,
          ">": lambda x, y: _f_lt(y, x), ">=": lambda x, y: _f_le(y, x)}


def _n_eq(x, y):
    return x == y or (x.is_nan() and y.is_nan())


def _n_lt(x, y):
    try:
        return x < y
    except InvalidOperation:
        return y.is_nan() and not x.is_nan()


def _n_le(x, y):
    try:
        return x <= y
    except InvalidOperation:
        return y.is_nan()


_NUMERIC = {"=": _n_eq, "<>": lambda x, y: not _n_eq(x, y), "<": _n_lt, "<=": _n_le,
            ">": lambda x, y: _n_lt(y, x), ">=": lambda x, y: _n_le(y, x)}


def _bp(f):
    return lambda x, y: f(x.rstrip(" "), y.rstrip(" "))


_BPCHAR = {op: _bp(f) for op, f in _PLAIN.items()}


def comparator(typ, op: str):
    """The PostgreSQL comparison ``op`` for two values of ``typ`` (both already converted)."""
    if typ in (FLOAT4, FLOAT8):
        return _FLOAT[op]
    if typ is NUMERIC:
        return _NUMERIC[op]
    if typ is BPCHAR:
        return _BPCHAR[op]
    return _PLAIN[op]


def sort_key(typ):
    """A key giving PostgreSQL's btree order (for GREATEST/LEAST)."""
    if typ in (FLOAT4, FLOAT8):
        return lambda x: (1, 0.0) if x != x else (0, x)
    if typ is NUMERIC:
        return lambda x: (1, 0) if x.is_nan() else (0, x)
    if typ is BPCHAR:
        return lambda x: x.rstrip(" ")
    return lambda x: x


# --- LIKE ----------------------------------------------------------------------------------

def ascii_lower(s: str) -> str:
    """lower() under collation "C": only A-Z change."""
    return s.translate(_LOWER)


def ascii_upper(s: str) -> str:
    return s.translate(_UPPER)


_LOWER = {c: c + 32 for c in range(65, 91)}
_UPPER = {c: c - 32 for c in range(97, 123)}


@lru_cache(maxsize=1024)
def like_regex(pattern: str, fold: bool) -> re.Pattern:
    if fold:
        pattern = ascii_lower(pattern)
    out = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                raise FilterEvaluationError("LIKE pattern must not end with escape character",
                                            sqlstate="22025")
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if c == "%":
            out.append(".*")
        elif c == "_":
            out.append(".")
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def like(s: str, pattern: str) -> bool:
    return like_regex(pattern, False).fullmatch(s) is not None


def ilike(s: str, pattern: str) -> bool:
    return like_regex(pattern, True).fullmatch(ascii_lower(s)) is not None


def _frac_floor(x):
    return math.floor(x)
