"""Built-in functions a row filter may call, and the ones PostgreSQL refuses.

PostgreSQL allows only immutable built-in functions in a publication filter
(``contain_mutable_or_user_functions_checker``). Every function here is immutable in
``pg_proc`` for the signatures listed; ``NOT_IMMUTABLE`` names common functions that are
stable or volatile (``concat`` is stable because it calls output functions) so the error can
say why. Each entry resolves argument types to (parameter types, result type, implementation);
implementations see non-NULL values only (all of these are strict).
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_DOWN, ROUND_FLOOR, Decimal

from . import arith, temporal
from .errors import FilterEvaluationError
from .types import (BPCHAR, FLOAT4, FLOAT8, INT2, INT4, INT8, INTS, NUMERIC, STRINGS, TEXT,
                    TIMESTAMP, TIMESTAMPTZ, DATE, BOOL, PgType)

NOT_IMMUTABLE = {
    **dict.fromkeys(("now", "statement_timestamp", "transaction_timestamp", "concat",
                     "concat_ws", "format", "to_char", "to_date", "to_number", "to_timestamp",
                     "age", "current_setting", "current_database", "current_schema",
                     "current_user", "session_user", "date_part", "extract", "localtimestamp",
                     "current_timestamp", "current_date", "current_time", "localtime",
                     "pg_typeof", "version", "currval", "lastval", "quote_nullable",
                     "quote_literal", "has_table_privilege", "to_json", "to_jsonb",
                     "array_to_string", "string_to_array"), "stable"),
    **dict.fromkeys(("random", "random_normal", "clock_timestamp", "timeofday", "nextval",
                     "setval", "gen_random_uuid", "uuid_generate_v4", "txid_current",
                     "pg_backend_pid", "pg_sleep", "set_config", "pg_current_wal_lsn"),
                    "volatile"),
}
AGGREGATES = {"count", "sum", "avg", "min", "max", "array_agg", "string_agg", "bool_and",
              "bool_or", "every", "bit_and", "bit_or", "json_agg", "jsonb_agg", "stddev",
              "variance", "stddev_pop", "stddev_samp", "var_pop", "var_samp", "json_object_agg",
              "percentile_cont", "percentile_disc", "mode", "row_number", "rank", "dense_rank",
              "lag", "lead", "ntile", "first_value", "last_value", "nth_value", "cume_dist",
              "percent_rank"}
SET_RETURNING = {"generate_series", "unnest", "regexp_matches", "regexp_split_to_table",
                 "json_each", "jsonb_each", "json_array_elements", "jsonb_array_elements"}

_NUMS = (*INTS, NUMERIC, FLOAT4, FLOAT8)


def _num_family(t: PgType) -> PgType | None:
    """The overload PostgreSQL picks for a one-argument numeric function (abs, sign…)."""
    if t in _NUMS:
        return t
    return None


def _text_arg(t: PgType) -> bool:
    return t in STRINGS or t.name == "unknown"


def _substr(s: str, start: int, length: int | None = None) -> str:
    if length is None:
        return s[max(start, 1) - 1:]
    if length < 0:
        raise FilterEvaluationError("negative substring length not allowed", sqlstate="22011")
    end = start + length
    begin = max(start, 1)
    if end <= begin:
        return ""
    return s[begin - 1:end - 1]


def _left(s: str, n: int) -> str:
    return s[:n] if n >= 0 else s[:max(len(s) + n, 0)]


def _right(s: str, n: int) -> str:
    if n >= 0:
        return s[len(s) - n:] if n else ""
    return s[min(-n, len(s)):]


def _strpos(s: str, sub: str) -> int:
    return s.find(sub) + 1


def _trim(chars: str, left: bool, right: bool):
    def f(s: str, cs: str = chars) -> str:
        if left:
            s = s.lstrip(cs) if cs else s
        if right:
            s = s.rstrip(cs) if cs else s
        return s
    return f


def _replace(s: str, old: str, new: str) -> str:
    return s.replace(old, new) if old else s


def _repeat(s: str, n: int) -> str:
    return s * max(n, 0)


def _float_round(fn):
    def f(x: float) -> float:
        if x != x or x in (math.inf, -math.inf):
            return x
        return math.copysign(float(fn(x)), x) if fn(x) == 0 else float(fn(x))
    return f


def _num_round_to(mode):
    def f(x: Decimal, scale: int = 0) -> Decimal:
        if not x.is_finite():
            return x
        q = x.quantize(Decimal(1).scaleb(-scale), rounding=mode, context=arith.CTX)
        return q.quantize(Decimal(1), context=arith.CTX) if scale < 0 else q
    return f


def _numeric_ceil_floor(mode):
    def f(x: Decimal) -> Decimal:
        if not x.is_finite():
            return x
        return x.quantize(Decimal(1), rounding=mode, context=arith.CTX)
    return f


def _date_trunc(field: str, ts):
    try:
        return temporal.date_trunc(field, ts)
    except ValueError as exc:
        raise FilterEvaluationError(str(exc), sqlstate="22023") from exc


def _float_one_arg(name, fn):
    """round/floor/ceil/trunc: a float argument (or an integer, float8 being the preferred
    numeric type) uses the float8 variant; numeric uses the numeric one."""
    def resolve(args):
        if len(args) == 1 and args[0] in (*INTS, FLOAT4, FLOAT8) or args == [UNKNOWN_]:
            return [FLOAT8], FLOAT8, _float_round(fn)
        return None
    return resolve


UNKNOWN_ = PgType("unknown", 705, "u", "unknown")


def resolve(name: str, args: list[PgType]):
    """(parameter types, result type, implementation) or None when no signature fits."""
    n = len(args)
    texts = all(_text_arg(a) for a in args)
    if name in ("lower", "upper") and n == 1 and texts:
        return [TEXT], TEXT, arith.ascii_lower if name == "lower" else arith.ascii_upper
    if name in ("length", "char_length", "character_length") and n == 1 and texts:
        if args[0] is BPCHAR:
            return [BPCHAR], INT4, lambda s: len(s.rstrip(" "))
        return [TEXT], INT4, len
    if name == "octet_length" and n == 1 and texts:
        return [args[0] if args[0] is BPCHAR else TEXT], INT4, lambda s: len(s.encode())
    if name == "abs" and n == 1:
        t = _num_family(args[0]) or (FLOAT8 if args[0].name == "unknown" else None)
        if t is None:
            return None
        impl = (arith.int_ops(t)["abs"] if t in INTS else arith.NUMERIC_OPS["abs"]
                if t is NUMERIC else abs)
        return [t], t, impl
    if name in ("substr", "substring") and n in (2, 3) and _text_arg(args[0]):
        if all(a in (INT2, INT4) or a.name == "unknown" for a in args[1:]):
            return [TEXT] + [INT4] * (n - 1), TEXT, _substr
        return None
    if name in ("btrim", "ltrim", "rtrim", "trim") and n in (1, 2) and texts:
        left, right = name in ("btrim", "ltrim", "trim"), name in ("btrim", "rtrim", "trim")
        return [TEXT] * n, TEXT, _trim(" ", left, right)
    if name in ("left", "right") and n == 2 and _text_arg(args[0]) and args[1] in (INT2, INT4, UNKNOWN_):
        return [TEXT, INT4], TEXT, _left if name == "left" else _right
    if name in ("strpos", "position") and n == 2 and texts:
        return [TEXT, TEXT], INT4, _strpos
    if name == "starts_with" and n == 2 and texts:
        return [TEXT, TEXT], BOOL, str.startswith
    if name == "replace" and n == 3 and texts:
        return [TEXT] * 3, TEXT, _replace
    if name == "reverse" and n == 1 and texts:
        return [TEXT], TEXT, lambda s: s[::-1]
    if name == "repeat" and n == 2 and _text_arg(args[0]) and args[1] in (INT2, INT4, UNKNOWN_):
        return [TEXT, INT4], TEXT, _repeat
    if name in ("round", "trunc") and n in (1, 2):
        mode = "half_up" if name == "round" else ROUND_DOWN
        if n == 1 and args[0] in (*INTS, FLOAT4, FLOAT8):
            return [FLOAT8], FLOAT8, (_float_round(round) if name == "round"
                                      else _float_round(math.trunc))
        if args[0] in (*INTS, NUMERIC, UNKNOWN_) and (n == 1 or args[1] in (INT2, INT4, UNKNOWN_)):
            impl = arith.round_numeric if name == "round" else _num_round_to(mode)
            return [NUMERIC] + [INT4] * (n - 1), NUMERIC, impl
        return None
    if name in ("floor", "ceil", "ceiling") and n == 1:
        up = name != "floor"
        if args[0] in (*INTS, FLOAT4, FLOAT8):
            return [FLOAT8], FLOAT8, _float_round(math.ceil if up else math.floor)
        if args[0] in (NUMERIC, UNKNOWN_):
            return [NUMERIC], NUMERIC, _numeric_ceil_floor(ROUND_CEILING if up else ROUND_FLOOR)
        return None
    if name == "mod" and n == 2:
        kinds = [a for a in args if a is not UNKNOWN_]
        if not all(a in (*INTS, NUMERIC) for a in kinds):
            return None
        t = NUMERIC if NUMERIC in kinds else max(kinds or [INT4], key=INTS.index)
        impl = arith.NUMERIC_OPS["%"] if t is NUMERIC else arith.int_ops(t)["%"]
        return [t, t], t, impl
    if name == "date_trunc" and n == 2 and _text_arg(args[0]):
        if args[1] is TIMESTAMP:
            return [TEXT, TIMESTAMP], TIMESTAMP, _date_trunc
        if args[1] in (TIMESTAMPTZ, DATE, UNKNOWN_):
            raise MutableFunction("date_trunc(text, timestamp with time zone)", "stable")
        return None
    return None


KNOWN = {"lower", "upper", "length", "char_length", "character_length", "octet_length", "abs",
         "substr", "substring", "btrim", "ltrim", "rtrim", "trim", "left", "right", "strpos",
         "position", "starts_with", "replace", "reverse", "repeat", "round", "trunc", "floor",
         "ceil", "ceiling", "mod", "date_trunc"}


class MutableFunction(Exception):
    def __init__(self, signature: str, volatility: str):
        self.signature = signature
        self.volatility = volatility
        super().__init__(signature)
