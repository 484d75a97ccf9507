"""PostgreSQL wire timestamps: int64 microseconds since 2000-01-01 00:00:00 UTC.

Rules: conversion is exact integer arithmetic (no float rounding of microseconds); ISO output
is always UTC with six fractional digits so strings sort like the instants they name.
PostgreSQL's ``infinity``/``-infinity`` (int64 max/min) and instants outside Python's
``datetime`` range render as ``'infinity'``, ``'-infinity'`` or stay a raw number string.
"""

from __future__ import annotations

import datetime as _dt

#: Seconds between the Unix epoch and PostgreSQL's epoch (2000-01-01).
PG_EPOCH_UNIX_SECONDS = 946_684_800
_PG_EPOCH = _dt.datetime(2000, 1, 1, tzinfo=_dt.timezone.utc)
_US = _dt.timedelta(microseconds=1)
DT_NOBEGIN = -0x8000000000000000
DT_NOEND = 0x7FFFFFFFFFFFFFFF


def pg_time_to_unix_ms(us: int) -> int:
    """Milliseconds since the Unix epoch (floor division, so instants before 1970 round down)."""
    return (us + PG_EPOCH_UNIX_SECONDS * 1_000_000) // 1000


def pg_time_to_datetime(us: int) -> _dt.datetime:
    """Aware UTC datetime. Raises ``OverflowError`` outside year 1–9999 (incl. infinities)."""
    return _PG_EPOCH + _dt.timedelta(microseconds=us)


#: (second, its ISO text up to the fraction) of the last ``pg_time_to_iso`` call: a stream of
#: small transactions commits many times a second, so most calls only format the fraction
_last_second: list = [None, ""]


def pg_time_to_iso(us: int) -> str:
    """``2024-01-02T03:04:05.123456+00:00``."""
    second, fraction = divmod(us, 1_000_000)
    last = _last_second
    if second == last[0]:
        return "%s.%06d+00:00" % (last[1], fraction)
    text = _pg_time_to_iso(us)
    if len(text) == 32 and text[0] != "-":  # years 1-9999: cache the second's prefix
        last[1], last[0] = text[:19], second
    return text


def _pg_time_to_iso(us: int) -> str:
    if us == DT_NOEND:
        return "infinity"
    if us == DT_NOBEGIN:
        return "-infinity"
    try:
        moment = _PG_EPOCH + _dt.timedelta(microseconds=us)
    except OverflowError:
        return str(us)
    return moment.isoformat(timespec="microseconds")
