"""``pgrouter verify``'s core: a topic folded by key at one position, compared with the rows
the route would hold at that position.

Rules (the consumer's view of a topic, docs/materializer.md and docs/record-formats.md):

* Input is pgrouter's envelope, whatever format the topic holds (``envelope_of``: the JSON
  format as it is, a Kafka Connect record's ``payload``, an Avro record read back by
  ``router.formats.avro_read``), and the record's key decoded (a dict, or None for a keyless table).
  Columns named in ``unchanged_toast`` are left out of ``after`` (Connect writes a
  placeholder there).
* The cut: a record whose ``source.commit_lsn`` is at or after ``cut`` is ignored (a
  transaction is in the source snapshot iff it committed before the snapshot's consistent
  point) — unless it is past ``end``, the source's WAL end once the topic's end offsets
  were taken: no record the router writes can be there, so it is damage a consumer keeps
  (and orders after anything the router writes): folded as any record, and named
  (``beyond``). Records that are not row changes (messages, transaction metadata) are
  skipped. A tombstone (a key, no value) removes the key's row, as compaction does for a
  consumer, unless it follows the key's delete (``TopicFold.tombstone``).
* Per key, a record applies only when its position ``(commit_lsn, seq)`` is after the last
  one applied to that key: a record written twice (after a restart) or an older one read
  after a newer one changes nothing. Deletes are remembered with their position for that.
* ``c``, ``r``, ``u``: the row becomes ``after``; each column named in ``unchanged_toast`` keeps
  the value the key held before (``MISSING`` when it held none: the topic lost it). An update
  whose ``before`` names another key (the JSON format's key change) also removes that key.
  ``d``: the key is gone. ``t``: every row applied before the truncate's position is gone.
* Keyless tables (null keys, spread over partitions) are multisets: their records are kept and
  applied in position order at the end (a delete or an update's old row removes one equal
  row).
* Values are compared by a digest per column (the hash of the value with its type; of its
  canonical JSON when it is not a scalar), so the state is a tuple of integers per key,
  whatever the row's size. Digests are only compared within one process (``hash`` is
  salted per process).
"""

from __future__ import annotations

from array import array
from collections import Counter

import msgspec

_encode = msgspec.json.Encoder(order="sorted").encode

#: the digest of a column whose value the topic lost (unchanged TOAST without an earlier value)
MISSING = -1
_GONE = None  # a deleted key's row


_COLUMNS: dict[tuple, tuple] = {}  # one tuple object per column layout


def digest(value) -> int:
    """A column value's digest: of the value with its type (1, 1.0, True and "1" differ),
    of its canonical JSON when it is not a scalar."""
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return hash((t, value))
    if t is float:
        return hash((t, value if value == value else "nan"))
    return hash((t, _encode(value)))


def packed(cols: tuple, digests) -> tuple[tuple, bytes]:
    """A row's state: its column names (one tuple per layout, shared) and their digests as
    8 bytes each (a tenth of a tuple of integers' memory)."""
    return _COLUMNS.setdefault(cols, cols), array("q", digests).tobytes()


def unpacked(digests: bytes) -> array:
    out = array("q")
    out.frombytes(digests)
    return out


def row_digests(row: dict) -> tuple[tuple, bytes]:
    """(column names, their digests packed) of a row."""
    return packed(tuple(row), [digest(v) for v in row.values()])


def _columns_of(row: tuple[tuple, bytes]) -> dict[str, int]:
    return dict(zip(row[0], unpacked(row[1])))


def _carried(row: tuple[tuple, bytes], prev, toast) -> tuple[tuple, bytes]:
    """``row`` with each column of ``toast`` holding its digest in ``prev`` (``MISSING``
    without one). Digests past the columns' (``router.verify.digests``'s bucket and row
    digest) are kept, the last one becoming ``MISSING``: the row's text is not known."""
    old = _columns_of(prev) if prev else {}
    digests = unpacked(row[1])
    cols = dict(zip(row[0], digests))
    tail = list(digests[len(row[0]):])
    for col in toast:
        cols[col] = old.get(col, MISSING)
    if tail:
        tail[-1] = MISSING
    names = tuple(sorted(cols)) if tail else tuple(cols)  # bucket digests: sorted by name
    return packed(names, [cols[c] for c in names] + tail)


def key_of(key) -> bytes | None:
    """A decoded record key as comparable bytes (None for a keyless table)."""
    return None if key is None else _encode(key)


def envelope_of(doc) -> dict | None:
    """pgrouter's envelope from a decoded JSON or Kafka Connect value (None: not a change)."""
    if isinstance(doc, dict) and "payload" in doc and "schema" in doc:
        doc = doc["payload"]
    if not isinstance(doc, dict) or doc.get("op") not in ("c", "r", "u", "d", "t"):
        return None
    toast = doc.get("unchanged_toast")
    if toast and isinstance(doc.get("after"), dict):
        doc = dict(doc, after={c: v for c, v in doc["after"].items() if c not in toast})
    return doc


def utf8_checked(data: bytes) -> bytes:
    """``data`` when it is UTF-8 (a JSON value a consumer's parser reads); ``ValueError``
    otherwise: msgspec's typed decoders skip the members they do not take unread."""
    if not data.isascii():
        try:
            data.decode()
        except UnicodeDecodeError as exc:
            raise ValueError(f"a JSON value that is not UTF-8 (byte {exc.start})") from None
    return data


def key_payload(doc):
    """A decoded JSON or Kafka Connect key as the key's column dict."""
    if isinstance(doc, dict) and "payload" in doc and "schema" in doc:
        return doc["payload"]
    return doc


def position(env: dict) -> int:
    """``(commit_lsn, seq)`` as one integer (ordered alike, a third of a tuple's memory)."""
    src = env.get("source") or {}
    return (int(src.get("commit_lsn") or 0) << 64) | int(src.get("seq") or 0)


def salted(key, row: dict) -> tuple[tuple, tuple]:
    """The default digests of a row (``digest``, for comparing within this process)."""
    return row_digests(row)


class TopicFold:
    """One topic folded by key, up to (not including) position ``cut``. ``digester(key,
    row) -> (columns, digests)`` digests each row (``salted``, or the bucket digests'
    ``router.verify.digests.digester``)."""

    def __init__(self, cut: int, digester=salted, part=None):
        self.cut = cut
        self.digester = digester
        #: ``part(key) -> bool``: only these keys are folded (a pass of a verify in passes)
        self.part = part
        self.rows: dict[bytes, tuple[int, tuple[tuple, bytes] | None]] = {}
        self.truncated: int | None = None
        self._keyless: list[tuple[int, str, dict | None, dict | None]] = []
        self.records = 0  # change records applied or skipped as duplicates
        self.after_cut = 0  # records at or after the cut, ignored
        #: the source's WAL end when the topic's end offsets were taken (None: not known)
        self.end: int | None = None
        #: (key, commit LSN) of records past ``end``: damage, folded and named
        self.beyond: list[tuple] = []
        #: partition -> its first offset, of those whose oldest records were deleted
        self.starts: dict[int, int] = {}
        #: key -> position of its delete past the cut (``tombstone``)
        self._later: dict[bytes, int] = {}

    def add(self, key, env: dict | None) -> None:
        """One record: its decoded key (None: keyless) and envelope (None: skip)."""
        if env is None:
            return
        self.apply(key, env["op"], position(env), env.get("before"), env.get("after"),
                   env.get("unchanged_toast"))

    def apply(self, key, op: str, pos: int, before, after, toast) -> None:
        """One change record taken apart (``add``; ``after`` without the columns named in
        ``toast``)."""
        lsn = pos >> 64
        if lsn >= self.cut:
            if self.end is None or lsn <= self.end:
                self.after_cut += 1
                self._removed_later(key, op, before, pos)
                return
            if key is None or self.part is None or self.part(key):
                self.beyond.append((key, lsn))
        self.records += 1
        if op == "t":
            if self.truncated is None or pos > self.truncated:
                self.truncated = pos
            return
        if key is None:
            self._keyless.append((pos, op, before, after))
            return
        part = self.part
        if part is not None and not part(key):
            return
        k = key_of(key)
        rows = self.rows
        held = rows.get(k)
        if held is not None and held[0] >= pos:
            return  # a duplicate, or older than what the key holds
        if op == "d":
            rows[k] = (pos, _GONE)
            return
        row = self.digester(key, after if isinstance(after, dict) else {})  # {}: not a row
        if toast:
            row = _carried(row, held[1] if held is not None else None, toast)
        if op == "u" and before and isinstance(key, dict):
            old_key = {c: before.get(c) for c in key}
            old = key_of(old_key)
            if old != k and (part is None or part(old_key)):
                was = rows.get(old)
                if was is None or was[0] < pos:
                    rows[old] = (pos, _GONE)
        rows[k] = (pos, row)

    def _removed_later(self, key, op: str, before, pos: int) -> None:
        """A delete (or the JSON format's key change) past the cut: the route's own
        tombstone that follows it is no damage (``tombstone``)."""
        if isinstance(key, dict) and (op == "d" or (op == "u" and isinstance(before, dict))):
            old = key if op == "d" else {c: before.get(c) for c in key}
            self._later[key_of(old)] = pos

    def tombstone(self, key) -> None:
        """A tombstone (a key, no value): a compacted topic's consumer loses the row the key
        holds, unless the tombstone follows the key's delete (a route's ``tombstones =
        true``; past the cut: the delete was ignored, so is its tombstone)."""
        if key is None or (self.part is not None and not self.part(key)):
            return
        k = key_of(key)
        held = self.rows.get(k)
        if held is None or held[1] is _GONE or self._later.get(k, -1) > held[0]:
            return
        self.rows[k] = (held[0], _GONE)

    def keyed(self) -> dict[bytes, tuple[tuple, bytes]]:
        """key -> column digests of every row the topic holds (deletes and truncates
        applied)."""
        cut = self.truncated
        return {k: row for k, (pos, row) in self.rows.items()
                if row is not _GONE and (cut is None or pos > cut)}

    def taken(self) -> dict[bytes, tuple[tuple, bytes]]:
        """``keyed()`` made of the fold's own dict, which the fold no longer holds (no second
        dict of every key at the peak of memory)."""
        rows, self.rows = self.rows, {}
        cut, gone = self.truncated, []
        for k, (pos, row) in rows.items():
            if row is _GONE or (cut is not None and pos <= cut):
                gone.append(k)
            else:
                rows[k] = row  # a value replaced in place: the dict does not change size
        for k in gone:
            del rows[k]
        return rows

    def keyless(self) -> Counter:
        """The keyless rows the topic holds, as a multiset of row digests."""
        held: Counter = Counter()
        for pos, op, before, after in sorted(self._keyless, key=lambda r: r[0]):
            if self.truncated is not None and pos < self.truncated:
                continue
            if op in ("d", "u") and before:
                k = row_key(before)
                if held[k] > 0:
                    held[k] -= 1
            if op in ("c", "r", "u") and after is not None:
                held[row_key(after)] += 1
        return +held


def row_key(row: dict) -> bytes:
    """A whole row as comparable bytes (the identity of a keyless table's row)."""
    return _encode(row)


class Comparison(msgspec.Struct):
    """What a route's topic holds against the source, for one topic."""

    route: str
    topic: str
    tables: list[str]
    compared: int = 0
    matching: int = 0
    missing: int = 0
    extra: int = 0
    different: int = 0
    #: topic keys the source no longer holds, kept because the route publishes no DELETE
    kept: int = 0
    missing_keys: list = []
    extra_keys: list = []
    different_keys: list = []  # [{"key": …, "columns": […]}]
    seconds: float = 0.0
    #: source rows read and compared one by one (the others: by their buckets' digests)
    rows_read: int = 0
    #: key buckets compared by digests (0: none, every row read), and those that differed
    buckets: int = 0
    buckets_differing: int = 0
    #: differing buckets of too many rows to read whole, split into sub-buckets compared
    #: by their digests again (bisect)
    buckets_split: int = 0
    #: passes over the topic (more than one when its keys exceed ``--max-keys``)
    passes: int = 1
    #: records whose commit LSN is past the source's WAL end (damage: no record the router
    #: writes can be there, and a consumer ordering by position keeps them), with examples
    #: ``{"key": …, "commit_lsn": …}``
    beyond: int = 0
    beyond_keys: list = []
    #: what else the reader should know (a partition whose oldest records were deleted)
    notes: list = []

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.different or self.beyond)


class Comparer:
    """Source rows (as the route's records give them) against a folded topic. ``actions``
    are the route's: without ``delete`` keys absent from the source are kept (a subscriber
    keeps them too), without ``update`` values are not compared (the topic keeps a row as
    inserted), without ``insert`` rows missing from the topic are not counted."""

    def __init__(self, result: Comparison, fold: TopicFold, actions: frozenset[str],
                 examples: int = 5, collect: bool = False):
        self.result = result
        self.digester = fold.digester
        self.part = fold.part
        #: with ``collect``: every key to send again (missing, different) and to delete
        self.collect = collect
        self.send: list = []
        self.delete: list = []
        self.actions = actions
        self.examples = examples
        self.topic = fold.taken()
        self.topic_keyless = fold.keyless()
        result.beyond += len(fold.beyond)
        for key, lsn in fold.beyond[: max(0, examples - len(result.beyond_keys))]:
            result.beyond_keys.append({"key": key, "commit_lsn": lsn})
        self.source_keyless: Counter = Counter()

    def row(self, key, after: dict) -> None:
        """One source row: its decoded key (None: keyless) and its values."""
        if key is not None and self.part is not None and not self.part(key):
            return  # another pass's
        r = self.result
        r.compared += 1
        r.rows_read += 1
        if key is None:
            self.source_keyless[row_key(after)] += 1
            return
        k = key_of(key)
        held = self.topic.pop(k, None)
        if held is None:
            if "insert" in self.actions:
                r.missing += 1
                self._example(r.missing_keys, key)
                if self.collect:
                    self.send.append(key)
            else:
                r.matching += 1
            return
        if "update" not in self.actions:
            r.matching += 1
            return
        want = self.digester(key, after)
        if want == held:
            r.matching += 1
            return
        want, held = _columns_of(want), _columns_of(held)
        cols = sorted(c for c in set(want) | set(held) if want.get(c) != held.get(c))
        if cols:
            r.different += 1
            if self.collect:
                self.send.append(key)
            if len(r.different_keys) < self.examples:
                r.different_keys.append({"key": key, "columns": cols})
        else:
            r.matching += 1

    def skip_equal(self, rows: int, keep) -> None:
        """``rows`` source rows are known equal to the topic's by their buckets' digests:
        counted as compared and matching; the topic keeps only the keys ``keep(key)`` (of
        the buckets that differ, whose rows are compared one by one; None: no key)."""
        self.result.compared += rows
        self.result.matching += rows
        self.topic = ({k: v for k, v in self.topic.items() if keep(k)}
                      if self.topic and keep is not None else {})

    def finish(self) -> Comparison:
        """The rows the topic holds and the source does not, counted; the result."""
        r = self.result
        for k in self.topic:
            if "delete" in self.actions:
                r.extra += 1
                self._example(r.extra_keys, msgspec.json.decode(k))
                if self.collect:
                    self.delete.append(msgspec.json.decode(k))
            else:
                r.kept += 1
        self.topic = {}
        src, top = self.source_keyless, self.topic_keyless
        missing, extra = src - top, top - src
        r.matching += sum((src & top).values())
        r.missing += sum(missing.values())
        for row in list(missing)[: max(0, self.examples - len(r.missing_keys))]:
            r.missing_keys.append(msgspec.json.decode(row))
        n_extra = sum(extra.values())
        if "delete" in self.actions:
            r.extra += n_extra
            for row in list(extra)[: max(0, self.examples - len(r.extra_keys))]:
                r.extra_keys.append(msgspec.json.decode(row))
        else:
            r.kept += n_extra
        return r

    def _example(self, where: list, key) -> None:
        if len(where) < self.examples:
            where.append(key)
