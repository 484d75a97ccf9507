"""date / timestamp / timestamptz values as PostgreSQL keeps them.

* a ``date`` is an int: days since 1970-01-01 (proleptic Gregorian; 1 BC is year 0);
* a ``timestamp`` / ``timestamptz`` is an int: microseconds since 1970-01-01 00:00:00 (UTC for
  timestamptz);
* ``infinity`` / ``-infinity`` are the floats ``inf`` / ``-inf``, so they order correctly
  against every finite value and survive date → timestamp conversion.

Text accepted: what PostgreSQL prints with ``DateStyle = ISO`` (``2024-01-02``,
``2024-01-02 03:04:05.123456``, ``2024-01-02 03:04:05+05:30``, ``... BC``) plus ``T`` as the
separator and ``Z`` / ``UTC`` as a zone. A timestamptz without a zone is taken as UTC: the router
connects with ``TimeZone=UTC``, which is also how PostgreSQL would have read such a constant.
Special words that depend on the clock (``now``, ``today``…) raise ``ValueError``.

The calendar arithmetic is ``router.postgres.datetimes``'s; the parsing is not: a filter constant is
read as PostgreSQL's input function reads it (lenient, ``epoch``, ``24:00``, rounding past six
digits), a replicated value only as PostgreSQL's output function prints it.
"""

from __future__ import annotations

import re

from ..postgres.datetimes import DAY_MICROS as USECS_PER_DAY
from ..postgres.datetimes import civil_from_days, days_from_civil, month_days

INF = float("inf")

_DATE_RE = re.compile(r"(\d{4,})-(\d{1,2})-(\d{1,2})")
_TS_RE = re.compile(
    r"(\d{4,})-(\d{1,2})-(\d{1,2})"
    r"(?:[ T](\d{1,2}):(\d{2})(?::(\d{2})(?:\.(\d*))?)?)?"
    r"\s*(Z|UTC|GMT|[+-]\d{1,2}(?::?\d{2}(?::?\d{2})?)?)?", re.IGNORECASE)
_CLOCK_WORDS = {"now", "today", "tomorrow", "yesterday", "allballs"}


def _special(s: str):
    low = s.lower()
    if low in ("infinity", "+infinity"):
        return INF
    if low == "-infinity":
        return -INF
    if low == "epoch":
        return 0
    if low in _CLOCK_WORDS:
        raise ValueError(f"{low!r} depends on the clock and is not supported")
    return None


def _split_era(s: str) -> tuple[str, bool]:
    if s[-3:].upper() == " BC":
        return s[:-3].rstrip(), True
    if s[-3:].upper() == " AD":
        return s[:-3].rstrip(), False
    return s, False


def _ymd(y: str, m: str, d: str, bc: bool) -> int:
    year, month, day = int(y), int(m), int(d)
    if bc:
        if year == 0:
            raise ValueError("year 0 BC")
        year = 1 - year
    if not (1 <= month <= 12 and 1 <= day <= month_days(year, month)):
        raise ValueError("date/time field value out of range")
    return days_from_civil(year, month, day)


def parse_date(text: str):
    s = text.strip()
    sp = _special(s)
    if sp is not None:
        return sp
    s, bc = _split_era(s)
    m = _DATE_RE.fullmatch(s)
    if not m:
        # a timestamp given for a date keeps its date part
        return floor_day(parse_timestamp(text, with_zone=False))
    return _ymd(*m.groups(), bc)


def parse_timestamp(text: str, *, with_zone: bool):
    s = text.strip()
    sp = _special(s)
    if sp is not None:
        return sp * USECS_PER_DAY if sp == 0 else sp
    s, bc = _split_era(s)
    m = _TS_RE.fullmatch(s)
    if not m:
        raise ValueError("invalid input syntax")
    y, mo, d, hh, mi, ss, frac, zone = m.groups()
    days = _ymd(y, mo, d, bc)
    h, minute, sec = int(hh or 0), int(mi or 0), int(ss or 0)
    if h > 24 or minute > 59 or sec > 60 or (h == 24 and (minute or sec or (frac or "").strip("0"))):
        raise ValueError("date/time field value out of range")
    usec = 0
    if frac:
        digits = (frac + "000000")[:7]
        usec = (int(digits) + 5) // 10  # round half up at the microsecond
    value = days * USECS_PER_DAY + ((h * 60 + minute) * 60 + sec) * 1_000_000 + usec
    if with_zone and zone and zone.upper() not in ("Z", "UTC", "GMT"):
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        zh = int(digits[:-2] if len(digits) > 2 else digits)
        zm = int(digits[-2:]) if len(digits) > 2 else 0
        zs = 0
        if len(digits) > 4 and ":" in zone[1:] and zone.count(":") == 2:
            zh, zm, zs = (int(p) for p in zone[1:].split(":"))
        value -= sign * ((zh * 60 + zm) * 60 + zs) * 1_000_000
    return value


def floor_day(usecs):
    if usecs in (INF, -INF):
        return usecs
    return usecs // USECS_PER_DAY


def date_to_timestamp(days):
    if days in (INF, -INF):
        return days
    return days * USECS_PER_DAY


_TRUNC_UNITS = {"microseconds": 1, "milliseconds": 1000, "second": 1_000_000,
                "minute": 60_000_000, "hour": 3_600_000_000, "day": USECS_PER_DAY}
_TRUNC_ALIASES = {"microsecond": "microseconds", "us": "microseconds", "usec": "microseconds",
                  "millisecond": "milliseconds", "ms": "milliseconds", "msec": "milliseconds",
                  "seconds": "second", "sec": "second", "s": "second", "minutes": "minute",
                  "min": "minute", "hours": "hour", "h": "hour", "days": "day", "d": "day",
                  "weeks": "week", "months": "month", "mon": "month", "years": "year",
                  "y": "year", "decades": "decade", "centuries": "century",
                  "millennia": "millennium", "millenniums": "millennium", "quarters": "quarter"}


def date_trunc(field: str, ts):
    """``date_trunc(text, timestamp)`` — immutable; the timestamptz variant is not."""
    unit = field.strip().lower()
    unit = _TRUNC_ALIASES.get(unit, unit)
    if unit not in _TRUNC_UNITS and unit not in (
            "week", "month", "quarter", "year", "decade", "century", "millennium"):
        raise ValueError(f'unit "{field}" not recognized for type timestamp without time zone')
    if ts in (INF, -INF):
        return ts
    if unit in _TRUNC_UNITS:
        step = _TRUNC_UNITS[unit]
        return ts // step * step
    days = ts // USECS_PER_DAY
    if unit == "week":
        return (days - (days + 3) % 7) * USECS_PER_DAY  # ISO weeks start on Monday
    y, m, _ = civil_from_days(days)
    if unit == "month":
        return days_from_civil(y, m, 1) * USECS_PER_DAY
    if unit == "quarter":
        return days_from_civil(y, (m - 1) // 3 * 3 + 1, 1) * USECS_PER_DAY
    if unit == "year":
        return days_from_civil(y, 1, 1) * USECS_PER_DAY
    # PostgreSQL counts decades/centuries/millennia in AD/BC years (no year 0)
    if unit == "decade":
        return days_from_civil(y // 10 * 10, 1, 1) * USECS_PER_DAY
    span = 100 if unit == "century" else 1000
    if y > 0:
        yy = (y + span - 1) // span * span - span + 1
    else:
        yy = -((span - 1 - (y - 1)) // span * span) + 1  # first year of the BC period
    return days_from_civil(yy, 1, 1) * USECS_PER_DAY
