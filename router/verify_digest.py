"""Bucket digests ``pgrouter verify`` computes on both sides of a JSON-format topic: in SQL by
PostgreSQL over the table's rows (``actors.verify.digests``), and here over the folded topic,
so that only the rows of buckets whose digests differ are read and compared.

Rules (both sides compute exactly this):

* A column's text is PostgreSQL's text of the value, as the JSON format carries it back:
  integers, text forms and JSON strings as they are (``col::text``; char(n) through its
  output function, which keeps the padding its cast to text trims); booleans ``true`` /
  ``false`` (``bool::text``); finite floats as the hex of their float8 bytes
  (``float8send(col::text::float8)``: the JSON number is the double the column's text
  parses to), ``NaN`` / ``Infinity`` / ``-Infinity`` as text.
* The key's text: for each key column, sorted by name, ``length:text`` (NULL ``!``), joined
  by ``,``. Its bucket: the first 7 hex digits of its md5, modulo the number of buckets.
* A column's digest: the first 15 hex digits of the md5 of ``key|name:text`` (``key|name!``
  for NULL), as an integer; a row's digest is the sum of its columns' (the key is in each, so
  values swapped between rows change it). A bucket's digest is its row count and the sum of
  its rows' digests.
* A value that does not fit these rules (a list, a dict) gets a text no SQL side produces: its
  bucket differs, and its rows are compared one by one, so digests never make a difference
  disappear, they only save reading rows that are equal.
"""

from __future__ import annotations

import hashlib
import struct

import msgspec

from .verify import packed, unpacked

_pack = struct.Struct(">d").pack
_NONFINITE = frozenset({"NaN", "Infinity", "-Infinity"})


def pg_text(value) -> str | None:
    """A JSON-format value as the text the SQL side renders for its column."""
    t = type(value)
    if t is str or value is None:
        return value
    if t is bool:
        return "true" if value else "false"
    if t is int:
        return str(value)
    if t is float:
        return _pack(value).hex()
    return "\x00" + msgspec.json.encode(value).decode()  # never what SQL renders


def key_text(key: dict) -> str:
    if len(key) == 1:
        [value] = key.values()
        text = pg_text(value)
        return "!" if text is None else f"{len(text)}:{text}"
    parts = []
    for name in sorted(key):
        text = pg_text(key[name])
        parts.append("!" if text is None else f"{len(text)}:{text}")
    return ",".join(parts)


def bucket_of(ktext: str, buckets: int) -> int:
    return int(hashlib.md5(ktext.encode()).hexdigest()[:7], 16) % buckets


def column_digest(ktext: str, name: str, value) -> int:
    text = pg_text(value)
    body = f"{ktext}|{name}!" if text is None else f"{ktext}|{name}:{text}"
    return int(hashlib.md5(body.encode()).hexdigest()[:15], 16)


def row_columns(key: dict, row: dict) -> tuple[tuple, bytes]:
    """(column names, their digests packed) of a row of ``key`` (``router.verify.TopicFold``'s
    digester for topics compared by buckets)."""
    ktext = key_text(key)
    return packed(tuple(row), [column_digest(ktext, c, v) for c, v in row.items()])


def bucket_sums(rows: dict, buckets: int) -> tuple[dict[int, list], dict[bytes, int]]:
    """bucket -> [rows, digest sum] of a fold's rows (``TopicFold.keyed``: key bytes ->
    (columns, digests)), and each key's bucket."""
    out: dict[int, list] = {}
    where: dict[bytes, int] = {}
    decode = msgspec.json.decode
    for k, (_cols, digests) in rows.items():
        b = where[k] = bucket_of(key_text(decode(k)), buckets)
        acc = out.get(b)
        if acc is None:
            acc = out[b] = [0, 0]
        acc[0] += 1
        acc[1] += sum(unpacked(digests))
    return out, where


def buckets_for(rows: int) -> int:
    """Buckets for a table of about ``rows`` rows: about 500 rows each, at most 65536."""
    return max(1, min(65536, rows // 500))
