"""Bucket digests ``pgrouter verify`` computes on both sides of a topic: over the table's rows,
from the columns' texts PostgreSQL renders (``actors.verify.digests``; ``copy_sums_py``,
``router._native.verify_copy`` in C), and over the folded topic (``digester``;
``fold_batch_py``, ``router._native.verify_fold`` in C, a batch of messages at a time), so
that only the rows of buckets whose digests differ are read and compared. The JSON format's
rules follow; the Connect and Avro formats use them for the types they carry alike
(``actors.verify.digests.digestible``).

Rules (both sides compute exactly this):

* A column's text is PostgreSQL's text of the value, as the JSON format carries it back:
  integers, text forms and JSON strings as they are (``col::text``; char(n) through its
  output function, which keeps the padding its cast to text trims); booleans ``true`` /
  ``false`` (``bool::text``); finite floats as ``#`` and the hex of their float8 bytes
  (``float8send(col::text::float8)``: the JSON number is the double the column's text
  parses to), ``NaN`` / ``Infinity`` / ``-Infinity`` as the strings the JSON format writes.
* The JSON type is part of every digest (what a consumer sees is the value and its type):
  a string is quoted in the row's JSON array and its key text is ``length:text``; a number
  or boolean is bare in the array and ``length=text`` in the key; its column digest is its
  text's hash XOR ``RAW_SALT``. ``"24"`` and ``24``, ``"true"`` and ``true`` differ.
* The key's text: for each key column, sorted by name, ``length:text`` (``length=text``,
  NULL ``!``), joined by ``,``. Its bucket: the first 7 hex digits of its md5, modulo the
  number of buckets.
* A row's digest: the first 15 hex digits of the md5 of the key's text, the JSON array of
  the column names sorted, and the JSON array of their values in that order (``null`` for
  NULL, strings escaped as msgspec and PostgreSQL's ``to_json`` escape them), as an
  integer: one md5 a row on each side (the SQL side's sub-buckets of a bisect compute it in
  SQL). A bucket's digest is its row count and the sum of its rows'.
* A value that does not fit these rules (a list, a dict) gets a text no SQL side produces: its
  bucket differs, and its rows are compared one by one, so digests never make a difference
  disappear, they only save reading rows that are equal. So does a row whose columns were
  carried from an earlier record (unchanged TOAST: its digest is ``MISSING``).
* A differing bucket too big to read whole is split (bisect): a key's sub-bucket is the next
  7 hex digits of its key's md5, modulo the number of sub-buckets; sub-buckets' digests are
  as buckets' (``sub_sums``; SQL: ``sums_select`` with ``subs``).
* The fold keeps, per key, a salted digest per column (the hash of its text: to name the
  columns that differ in the buckets read one by one) followed by the key's bucket and the
  row's digest (``router.verify.fold.packed``: entries past the columns' are carried as they
  are). ``router._native.verify_row`` computes them in C (``row_digests_py`` its twin).
"""

from __future__ import annotations

import struct
from hashlib import md5
from operator import itemgetter

import msgspec

from ..native import NATIVE
from ..snapshot.core import parse_copy_data
from .fold import MISSING, utf8_checked

_pack = struct.Struct(">d").pack
_tail = struct.Struct("=qq").unpack_from
_acc = struct.Struct("=qQQ")
_from_bytes = int.from_bytes
_json = msgspec.json.encode
_decode = msgspec.json.decode


#: a column digest of a value that is not a str is its text's hash XOR this: the JSON type
#: is compared, "24" and 24 differ (``VERIFY_RAW_SALT`` of ``router/_native/native.h``)
RAW_SALT = 0x2545F4914F6CDD1D


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
        return _float_text(value)
    return "\x00" + msgspec.json.encode(value).decode()  # never what SQL renders


def key_text(key: dict) -> str:
    return _key_text(_layout(tuple(key)).values(key))


def _key_text(values) -> str:
    """The key's values, in the order of their columns' names, as text: ``length:text`` of
    a str, ``length=text`` of the others (their JSON type told apart), ``!`` of None."""
    return ",".join(["!" if t is None else f"{len(t)}{':' if v.__class__ is str else '='}{t}"
                     for v, t in zip(values, _texts(values))])


def bucket_of(ktext: str, buckets: int) -> int:
    return (_from_bytes(md5(ktext.encode()).digest()[:4], "big") >> 4) % buckets


def _float_text(value: float) -> str:
    return "#" + _pack(value).hex()  # never an int's text


def _bool_text(value: bool) -> str:
    return "true" if value else "false"


def _none_text(value: None) -> None:
    return None


#: pg_text by type, for the types of JSON values (others: ``pg_text``)
_TEXTS = {str: str.__str__, int: int.__repr__, float: _float_text, bool: _bool_text,
          type(None): _none_text}


class _Layout:
    """A column layout: its names sorted, their values in that order, the texts around."""

    __slots__ = ("names", "values", "head")

    def __init__(self, cols: tuple):
        self.names = tuple(sorted(cols))  # one tuple a layout, shared by its rows
        getter = itemgetter(*self.names) if self.names else (lambda row: ())
        self.values = getter if len(self.names) != 1 else (lambda row: (getter(row),))
        self.head = _json(list(self.names))


_LAYOUTS: dict[tuple, _Layout] = {}


def _layout(cols: tuple) -> _Layout:
    layout = _LAYOUTS.get(cols)
    if layout is None:
        layout = _LAYOUTS[cols] = _Layout(cols)
    return layout


def _texts(values) -> list:
    get = _TEXTS.get
    return [v if v.__class__ is str else (get(v.__class__) or pg_text)(v) for v in values]


def _row_json(values, texts) -> bytes:
    """The JSON array of a row's values as the digests render it: a str quoted, None null,
    the others' texts bare (an int's decimal, ``true``/``false``, ``#`` and a float's hex;
    a list's or a dict's text is a string no SQL side renders)."""
    if not any(v.__class__ is float for v in values):
        plain = [v if v.__class__ in _BARE else t for v, t in zip(values, texts)]
        return _json(plain)
    return b"[" + b",".join(t.encode() if v.__class__ is float else _json(
        v if v.__class__ in _BARE else t) for v, t in zip(values, texts)) + b"]"


#: JSON values written as they are (their text is msgspec's); others go through their text
_BARE = frozenset({str, int, bool, type(None)})


def _digest_of(value, text) -> int:
    """A column's digest: the hash of its text, XOR ``RAW_SALT`` when not a str (or None)."""
    h = hash(text)
    return h if value.__class__ is str or value is None else h ^ RAW_SALT


def row_digest(ktext: str, row: dict) -> int:
    """The row's digest (the SQL side's ``actors.verify.digests.sums_select``)."""
    layout = _layout(tuple(row))
    values = layout.values(row)
    h = md5(ktext.encode() + layout.head + _row_json(values, _texts(values)))
    return _from_bytes(h.digest()[:8], "big") >> 4


def row_digests_py(key: tuple, head: bytes, values: tuple, buckets: int) -> bytes:
    """The digests ``digester`` keeps of a row (the key's values and the row's, each in the
    order of their columns' names, ``head`` the row's names as JSON): the hash of each
    value's text, the key's bucket, the row's digest, 8 bytes each
    (``router._native.verify_row`` computes the same)."""
    texts = _texts(values)
    h = md5(_key_text(key).encode())
    bucket = (_from_bytes(h.digest()[:4], "big") >> 4) % buckets
    h.update(head + _row_json(values, texts))
    return struct.pack(f"={len(texts) + 2}q", *map(_digest_of, values, texts), bucket,
                       _from_bytes(h.digest()[:8], "big") >> 4)


def digester(buckets: int):
    """``router.verify.fold.TopicFold``'s digester for topics compared by ``buckets`` buckets:
    ``(key, row) -> (columns, digests)``: the columns sorted by name, the digests of their
    texts (salted, to name the columns that differ), then the key's bucket and the row's
    digest (``row_digests_py``). Values are compared by their texts, as the SQL side sees
    them."""
    fast = getattr(NATIVE, "verify_row", None)

    def row_columns(key: dict, row: dict) -> tuple[tuple, bytes]:
        layout = _layout(tuple(row))
        kv, values = _layout(tuple(key)).values(key), layout.values(row)
        if fast is not None:
            out = fast(kv, layout.head, values, buckets)
            if out is not None:
                return layout.names, out
        return layout.names, row_digests_py(kv, layout.head, values, buckets)

    row_columns.buckets = buckets  # the batch fold's sign (``fold_batch_py``)
    return row_columns


def layout_of(cols: tuple) -> tuple[tuple, bytes, tuple]:
    """A column layout for ``fold_batch_py``: its names sorted, their JSON, and for each
    sorted name its index in ``cols``."""
    layout = _layout(cols)
    return layout.names, layout.head, tuple(map(cols.index, layout.names))


def fold_batch_py(msgs: list, ends: dict, rows: dict, cut: int, buckets: int,
                  tools: tuple) -> tuple[int, int, int]:
    """A batch of a JSON-format topic's messages into a fold's ``rows`` (key bytes ->
    (position, (names, digests of ``digester(buckets)``))); ``router._native.verify_fold``
    computes the same. Returns (messages read, 0 (the feeder counts those past ``cut``), folded
    here).

    * A message with an error, or at or past its partition's end in ``ends`` (or of a
      partition not in it), is not read; a tombstone (a key, no value) goes to the feeder.
    * The plain case is folded here: a ``c``/``r``/``u`` record (``tools[0]`` decodes it;
      ``before`` and ``after`` may be left as their JSON, ``msgspec.Raw``) with a key (``tools[1]`` decodes it to a dict, ``tools[2]`` to the fold's key bytes),
      a source, ``after``, no ``before``, no ``unchanged_toast``: as
      ``router.verify.fold.TopicFold.apply`` with ``digester`` (``tools[3]``: ``layout_of``;
      ``tools[5]``: ``row_digests_py``). At or past the cut it goes to the feeder, which
      tells a later write (ignored) from a record past the source's WAL end (damage).
    * Anything else (and a record that does not decode, or is not UTF-8) goes to
      ``tools[4](key, value)``, the feeder (``actors.verify.topic.Decoder.feeder``)."""
    decode_change, decode_key, encode_key, layout, slow, row_py = tools
    read = after_cut = folded = 0
    for m in msgs:
        if m.error() is not None:
            continue
        end = ends.get(m.partition())
        if end is None or not m.offset() < end:
            continue
        read += 1
        kb, vb = m.key(), m.value()
        if vb is None:
            if kb is not None:  # a tombstone: the feeder's
                slow(kb, vb)
            continue
        done = _fold_one(rows, kb, vb, cut, buckets, decode_change, decode_key, encode_key,
                         layout, row_py)
        if done == 0:
            slow(kb, vb)
        folded += done == 1
        after_cut += done == 2
    return read, after_cut, folded


def _fold_one(rows, kb, vb, cut, buckets, decode_change, decode_key, encode_key, layout,
              row_py) -> int:
    """1 folded, 0 not the plain case or at or past the cut (nothing done)."""
    if kb is None:
        return 0
    try:
        c = decode_change(utf8_checked(vb))
        op, src, after, before, toast = c.op, c.source, c.after, c.before, c.unchanged_toast
        if before is not None and not isinstance(before, dict):  # JSON left raw
            before = _decode(before)
        if after is not None and not isinstance(after, dict):
            after = _decode(after)
    except Exception:  # noqa: BLE001 — the slow way decodes it again and says why
        return 0
    if (op not in ("c", "r", "u") or src is None or type(after) is not dict
            or before is not None or toast):
        return 0
    try:
        lsn, seq = src.commit_lsn or 0, src.seq or 0
        if not (type(lsn) is int and type(seq) is int and 0 <= lsn < 2**64
                and 0 <= seq < 2**64):
            return 0
    except Exception:  # noqa: BLE001
        return 0
    if lsn >= cut:
        return 0
    try:
        key = decode_key(kb)
    except Exception:  # noqa: BLE001
        return 0
    if type(key) is not dict:
        return 0
    names, head, order = layout(tuple(after))
    values = tuple(after[c] for c in names)
    kv = tuple(key[c] for c in layout(tuple(key))[0])
    k = encode_key(key)
    pos = (lsn << 64) | seq
    held = rows.get(k)
    if held is not None and held[0] >= pos:
        return 1
    rows[k] = (pos, (names, row_py(kv, head, values, buckets)))
    return 1


def copy_sums_py(data: bytes, keys: tuple, kinds: bytes, head: bytes, buckets: int,
                 acc: bytearray) -> int:
    """The source side's digests from whole lines of ``COPY (SELECT <the columns' texts, in
    the order of their names>) TO STDOUT`` (``router.snapshot.core.parse_copy_data``): per row,
    its key's text (the fields ``keys``, ``key_text``'s rules), its bucket and its digest
    (``row_digest``'s rules, ``head`` the names' JSON), added to ``acc`` (per bucket 24
    bytes: the row count, int64, and the digests' sum, 128 bits, the low 64 first, native
    byte order). ``kinds`` has a byte a field: ``s`` a string, ``r`` a JSON number or
    boolean whose field is its text as the topic side renders it (bare in the row's JSON).
    Returns the rows; a line of another number of fields than ``kinds`` is a
    ``ValueError``. ``router._native.verify_copy`` computes the same without the GIL."""
    rows = 0
    columns = len(kinds)
    quoted = [k == 0x73 for k in kinds]  # b"s"
    for row in parse_copy_data(data.decode()):
        if len(row) != columns:
            raise ValueError(f"verify_copy: a row without {columns} fields")
        ktext = ",".join(["!" if row[k] is None else
                          f"{len(row[k])}{':' if quoted[k] else '='}{row[k]}"
                          for k in keys]).encode()
        h = md5(ktext)
        bucket = (_from_bytes(h.digest()[:4], "big") >> 4) % buckets
        h.update(head + b"[" + b",".join(b"null" if v is None else _json(v) if q
                                         else v.encode() for v, q in zip(row, quoted))
                 + b"]")
        count, lo, hi = _acc.unpack_from(acc, bucket * 24)
        total = ((hi << 64) | lo) + (_from_bytes(h.digest()[:8], "big") >> 4)
        _acc.pack_into(acc, bucket * 24, count + 1, total & (2**64 - 1),
                       (total >> 64) & (2**64 - 1))
        rows += 1
    return rows


def acc_sums(acc: bytearray, into: dict[int, list]) -> None:
    """``copy_sums_py``'s accumulator added to ``into`` (bucket -> [rows, digest sum])."""
    for b in range(len(acc) // 24):
        count, lo, hi = _acc.unpack_from(acc, b * 24)
        if count:
            got = into.setdefault(b, [0, 0])
            got[0] += count
            got[1] += (hi << 64) | lo


def bucket_sums(rows: dict, buckets: int | None = None) -> dict[int, list]:
    """bucket -> [rows, digest sum] of a fold's rows (``TopicFold.keyed``: key bytes ->
    (columns, digests) of ``digester``). A bucket holding a row without a digest
    (``MISSING``) has the sum None: it differs. With ``buckets`` (the digester's), the C
    accelerator sums them (``router._native.verify_sums``; this the twin, also for a row of
    another shape or bucket, which it declines)."""
    fast = getattr(NATIVE, "verify_sums", None) if buckets else None
    if fast is not None:
        out = fast(rows, buckets)
        if out is not None:
            return out
    return bucket_sums_py(rows)


def bucket_sums_py(rows: dict) -> dict[int, list]:
    """``bucket_sums`` in Python (``router._native.verify_sums``' twin)."""
    out: dict[int, list] = {}
    for _cols, digests in rows.values():
        b, h = _tail(digests, len(digests) - 16)
        acc = out.get(b)
        if acc is None:
            acc = out[b] = [0, 0]
        acc[0] += 1
        if h == MISSING or acc[1] is None:
            acc[1] = None
        else:
            acc[1] += h
    return out


def bucket_in(row: tuple[tuple, bytes]) -> int:
    """The bucket of a row of ``digester``."""
    digests = row[1]
    return _tail(digests, len(digests) - 16)[0]


def differing(a: dict, b: dict) -> set:
    """The buckets (or sub-buckets) whose counts or sums differ between two sides."""
    return {k for k in set(a) | set(b) if a.get(k) != b.get(k)}


def sub_of(ktext: str, subs: int) -> int:
    """A key's sub-bucket: the 8th to 14th hex digits of its md5 (the 7 after its bucket's),
    modulo ``subs``."""
    return (_from_bytes(md5(ktext.encode()).digest()[3:7], "big") & 0x0FFFFFFF) % subs


def to_split(differ: set[int], source: dict, topic: dict, limit: int) -> set[int]:
    """The differing buckets holding more than ``limit`` rows on either side: split into
    sub-buckets compared again by their digests (bisect) rather than read whole."""
    return {b for b in differ
            if max((source.get(b) or (0,))[0], (topic.get(b) or (0,))[0]) > limit}


def subs_for(source: dict, topic: dict, split: set[int], rows: int = 500) -> int:
    """Sub-buckets a split bucket is cut into: about ``rows`` rows each (at least 2)."""
    most = max(max((source.get(b) or (0,))[0], (topic.get(b) or (0,))[0]) for b in split)
    return max(2, min(65536, -(-most // rows)))


def sub_sums(rows: dict, split: set[int],
             subs: int) -> tuple[dict[int, list], dict[bytes, int]]:
    """code (``bucket * subs + sub``) -> [rows, digest sum] of the fold's keys in the buckets
    ``split``, and each such key's code."""
    out: dict[int, list] = {}
    codes: dict[bytes, int] = {}
    decode = msgspec.json.decode
    for k, (_cols, digests) in rows.items():
        b, h = _tail(digests, len(digests) - 16)
        if b not in split:
            continue
        c = codes[k] = b * subs + sub_of(key_text(decode(k)), subs)
        acc = out.get(c)
        if acc is None:
            acc = out[c] = [0, 0]
        acc[0] += 1
        acc[1] = None if h == MISSING or acc[1] is None else acc[1] + h
    return out, codes


def buckets_for(rows: int) -> int:
    """Buckets for a table of about ``rows`` rows: about 500 rows each, at most 65536."""
    return max(1, min(65536, rows // 500))
