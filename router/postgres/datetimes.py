"""PostgreSQL's date and timestamp texts as numbers since the Unix epoch, over PostgreSQL's
whole range (4713 BC to 5874897 AD for dates, to 294276 AD for timestamps), and back: what
the Avro and Kafka Connect formats write for date and time columns, and what pgrouter's Avro
reader turns back into text.

Rules:

* Input is what PostgreSQL's output functions print with ``DateStyle = ISO`` (the walsender's
  and COPY's): ``YYYY-MM-DD`` (four or more year digits), timestamps with
  `` HH:MM:SS[.ffffff]`` (or ``T``), timestamptz with an offset ``±HH[:MM[:SS]]``, and
  `` BC`` at the end for years before 1 (1 BC is year 0 of the proleptic Gregorian
  calendar, 2 BC year -1, as ISO-8601 counts). ``infinity`` and ``-infinity`` are None.
  Anything else raises ``ValueError`` (the record formats turn it into one line naming the
  column: a value silently written as null would be lost).
* Python's ``datetime`` is not used: it holds years 1 to 9999 only.
* ``days``/``micros`` return exact integers; whether a target type holds them (Avro's int
  and long) is the caller's check (``fits``).
"""

from __future__ import annotations

import re

_DATE = re.compile(r"(\d{4,})-(\d\d)-(\d\d)")
_TIME = re.compile(r"[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?")
_OFFSET = re.compile(r"([+-])(\d\d)(?::(\d\d)(?::(\d\d))?)?")
_MDAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_INFINITE = ("infinity", "-infinity")
DAY_MICROS = 86_400_000_000
INT32 = (-2**31, 2**31 - 1)
INT64 = (-2**63, 2**63 - 1)


def fits(n: int | None, bounds: tuple[int, int]) -> int | None:
    """``n`` where ``bounds`` (a target type's range) hold it, else None."""
    return n if n is None or bounds[0] <= n <= bounds[1] else None


def month_days(y: int, m: int) -> int:
    """Days in month ``m`` of year ``y`` (proleptic Gregorian, year 0 is 1 BC)."""
    return _MDAYS[m - 1] + (m == 2 and y % 4 == 0 and (y % 100 != 0 or y % 400 == 0))


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm; Python's
    floor division makes it right for years before 0)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(z: int) -> tuple[int, int, int]:
    """The (year, month, day) of ``z`` days since 1970-01-01 (year 0 is 1 BC)."""
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (m <= 2), m, d


def _bc(text: str) -> tuple[str, bool]:
    return (text[:-3], True) if text.endswith(" BC") else (text, False)


def _day(text: str, bc: bool) -> tuple[int, int]:
    """(days since the epoch, end) of the date starting ``text``."""
    m = _DATE.match(text)
    if m is None:
        raise ValueError(f"not a date: {text[:40]!r}")
    y, mo, d = int(m[1]), int(m[2]), int(m[3])
    if bc:
        if y == 0:
            raise ValueError(f"not a date: {text[:40]!r}")
        y = 1 - y
    if not 1 <= mo <= 12 or not 1 <= d <= month_days(y, mo):
        raise ValueError(f"not a date: {text[:40]!r}")
    return days_from_civil(y, mo, d), m.end()


def days(text: str) -> int | None:
    """Days since 1970-01-01 of a date's text; None for ``±infinity``."""
    if text in _INFINITE:
        return None
    body, bc = _bc(text)
    out, end = _day(body, bc)
    if end != len(body):
        raise ValueError(f"not a date: {text[:40]!r}")
    return out


def micros(text: str, utc: bool) -> int | None:
    """Microseconds since 1970-01-01 00:00 of a timestamp's text (``utc``: a timestamptz,
    its offset applied; otherwise the wall time as it reads, an offset ignored); None for
    ``±infinity``."""
    if text in _INFINITE:
        return None
    body, bc = _bc(text)
    day, end = _day(body, bc)
    t = _TIME.match(body, end)
    if t is None:
        raise ValueError(f"not a timestamp: {text[:40]!r}")
    h, mi, s = int(t[1]), int(t[2]), int(t[3])
    if h > 23 or mi > 59 or s > 59:
        raise ValueError(f"not a timestamp: {text[:40]!r}")
    frac = int((t[4] or "").ljust(6, "0"))
    out = (day * 86400 + (h * 60 + mi) * 60 + s) * 1_000_000 + frac
    end = t.end()
    if end == len(body):
        return out
    o = _OFFSET.match(body, end)
    if o is None or o.end() != len(body):
        raise ValueError(f"not a timestamp: {text[:40]!r}")
    if utc:
        secs = (int(o[2]) * 60 + int(o[3] or 0)) * 60 + int(o[4] or 0)
        out -= (-1 if o[1] == "-" else 1) * secs * 1_000_000
    return out


def date_text(d: int) -> str:
    """PostgreSQL's text of ``d`` days since 1970-01-01."""
    y, m, day = civil_from_days(d)
    return (f"{y:04d}-{m:02d}-{day:02d}" if y > 0 else f"{1 - y:04d}-{m:02d}-{day:02d} BC")


def _clock(us: int) -> str:
    s, frac = divmod(us, 1_000_000)
    m, s = divmod(s, 60)
    h, m = divmod(m, 60)
    return f"{h:02d}:{m:02d}:{s:02d}" + (f".{frac:06d}" if frac else "")


def timestamp_text(us: int, zone: str = "") -> str:
    """PostgreSQL's text of ``us`` microseconds since the epoch (``zone``: ``+00`` for a
    timestamptz at UTC), e.g. ``10000-01-01 00:00:00+00`` or ``0044-03-15 12:00:00 BC``."""
    d, rest = divmod(us, DAY_MICROS)
    y, m, day = civil_from_days(d)
    year, bc = (y, "") if y > 0 else (1 - y, " BC")
    return f"{year:04d}-{m:02d}-{day:02d} {_clock(rest)}{zone}{bc}"


def iso_utc(us: int) -> str:
    """ISO-8601 at UTC (``2024-01-02T01:04:05.500000Z``), as Debezium's ZonedTimestamp:
    years past 9999 with a ``+``, years before 1 as ISO-8601 counts them (``0000`` is
    1 BC, ``-0001`` 2 BC), as Java's ``DateTimeFormatter.ISO_OFFSET_DATE_TIME`` prints."""
    d, rest = divmod(us, DAY_MICROS)
    y, m, day = civil_from_days(d)
    year = f"+{y}" if y > 9999 else f"{y:04d}" if y >= 0 else f"-{-y:04d}"
    return f"{year}-{m:02d}-{day:02d}T{_clock(rest)}Z"
