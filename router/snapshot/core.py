"""Snapshots in the core: positions of snapshot records, COPY text rows, watermark and
state records, and the chunk window of a backfill. Nothing here does I/O
(``actors.snapshot`` reads the tables and talks to Kafka).

Rules (README "Snapshots"):

* Positions. A snapshot record must order before every change the stream sends after the
  rows were read, and no two records of one table may share a position (consumers
  deduplicate by ``(commit_lsn, seq)``).
  - Initial snapshot: ``commit_lsn = consistent point - 1`` (every transaction the slot
    streams commits at or after its consistent point), ``seq = (table ordinal << 40) + row
    ordinal``, so the tables of one snapshot never share positions, also when several
    partitions go to one topic. ``lsn`` is the consistent point, ``xid`` 0.
  - Backfill chunk: the high watermark's transaction position, ``commit_lsn`` of that
    transaction, ``seq = change_count + row ordinal`` (after the watermark message itself):
    after every change inside the window and before every change after it.
* Rows come as PostgreSQL's COPY text format (the types' output functions, exactly what
  pgoutput sends in text mode): tab-separated, ``\\N`` for NULL, backslash escapes.
* Watermarks and backfill requests are transactional logical decoding messages with the
  prefix ``pgrouter.snapshot`` and a JSON body; they are read back from the stream in commit
  order, so a chunk's window is exactly the stream between its low and high watermark.
* A chunk row is dropped when the stream changed its key inside the window (insert, update
  of either key, delete), and every row when the table was truncated there: the change in
  the stream is newer than the row read, and it flows as usual. The same holds for a
  transaction committed just before the low watermark that the chunk's read could not see
  yet (``RecentChanges``).
* Unchanged TOAST. A streamed update that leaves a TOASTed value unchanged does not carry it
  (``unchanged_toast``): if its key's chunk row were only dropped, the topic would never
  carry that value. So the window keeps each changed key's latest image (values a later
  change left unchanged carried forward from an earlier one inside the window); when the
  latest image still lacks a value, no change inside the window touched it, so the chunk's
  read holds the value in force for the whole window: the row is emitted from the image with
  those values taken from the chunk row, after every change of the window (its position is
  the high watermark's). A key moved inside the window finds its chunk row under the key
  it had.
* SnapshotState records (compacted topic, keyed by kind, slot, route and table) say what is done:
  ``last_key`` of the last chunk whose records Kafka acknowledged, or ``done``.
"""

from __future__ import annotations

from collections import deque

import msgspec

from ..native import NATIVE
from ..pgoutput import UNCHANGED_TOAST

_copy_rows = NATIVE.copy_rows if NATIVE is not None else None

PREFIX = "pgrouter.snapshot"
#: bits of ``seq`` left for the row ordinal of one table in an initial snapshot
TABLE_SHIFT = 40

#: bits of ``seq`` left for the row ordinal within one block range of a split table
#: (``router.snapshot.ranges``)
RANGE_SHIFT = 32

_UNESCAPE = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}
_OCTAL, _HEX = "01234567", "0123456789abcdefABCDEF"


def initial_position(consistent_point: int, table_ordinal: int, row: int,
                     block_range: int = 0) -> tuple[int, int]:
    """(commit_lsn, seq) of row ``row`` of the ``table_ordinal``-th table of an initial
    snapshot taken at ``consistent_point``; of a split table, row ``row`` of its
    ``block_range``-th range."""
    return (consistent_point - 1,
            (table_ordinal << TABLE_SHIFT) + (block_range << RANGE_SHIFT) + row)


def _unescape(field: str) -> str:
    out = []
    i, n = 0, len(field)
    while i < n:
        c = field[i]
        if c == "\\" and i + 1 < n:
            nxt = field[i + 1]
            if nxt in _UNESCAPE:
                out.append(_UNESCAPE[nxt])
                i += 2
                continue
            octal = nxt in _OCTAL  # \ooo or \xhh (COPY never writes them; they may be read)
            if octal or (nxt == "x" and i + 2 < n and field[i + 2] in _HEX):
                start, digits = (i + 1, _OCTAL) if octal else (i + 2, _HEX)
                j = start
                while j < n and j < i + 4 and field[j] in digits:
                    j += 1
                out.append(chr(int(field[start:j], 8 if octal else 16)))
                i = j
                continue
            out.append(nxt)
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_copy_line(line: str) -> tuple:
    """One row of ``COPY … TO STDOUT`` (text format, without its newline) as a tuple of
    text values and None."""
    fields = line.split("\t")
    if "\\" not in line:
        return tuple(fields)
    return tuple(None if f == "\\N" else (_unescape(f) if "\\" in f else f) for f in fields)


def parse_copy_data(data: str) -> list[tuple]:
    """Whole lines of COPY text output (each ending with a newline) as row tuples."""
    lines = data.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if "\\" not in data:
        return [tuple(line.split("\t")) for line in lines]
    return [parse_copy_line(line) for line in lines]


def copy_rows_py(data: bytes) -> list[tuple]:
    """Whole lines of COPY text output as bytes (UTF-8) as row tuples: the reference of
    ``router._native.copy_rows``."""
    return parse_copy_data(data.decode())


def copy_rows(data: bytes) -> list[tuple]:
    """``copy_rows_py`` by the accelerator where it takes the input (``router.native``)."""
    if _copy_rows is not None:
        rows = _copy_rows(data)
        if rows is not None:
            return rows
    return parse_copy_data(data.decode())


# -- watermarks and requests ----------------------------------------------------------------


class Watermark(msgspec.Struct, frozen=True, omit_defaults=True):
    """The body of a ``pgrouter.snapshot`` message. ``kind``: ``low``/``high`` (a chunk's
    window; ``chunk`` names it) or ``request`` (``pgrouter snapshot``, ``chunk`` is its id:
    backfill ``tables`` — empty: every table the routes take — into ``routes``). ``keys``
    (``pgrouter verify --repair``): only the rows of these keys, each a list of the key
    columns' values (JSON, read back by PostgreSQL into the columns' types); a key the table
    does not hold gets a delete record. Requests without it (older ones too) take every row."""

    kind: str
    slot: str
    chunk: str = ""
    routes: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    keys: tuple[tuple, ...] = ()


_wm_decoder = msgspec.json.Decoder(Watermark)


def encode_watermark(mark: Watermark) -> bytes:
    return msgspec.json.encode(mark)


def decode_watermark(prefix: str, content: bytes) -> Watermark | None:
    """The watermark a logical message carries, or None when it is not one of ours (or not
    readable: a message of another program with our prefix is ignored, never fatal)."""
    if prefix != PREFIX:
        return None
    try:
        return _wm_decoder.decode(content)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


# -- progress -------------------------------------------------------------------------------


class SnapshotState(msgspec.Struct, frozen=True, omit_defaults=True):
    """One state record. ``kind``: ``initial`` (the initial snapshot of a slot, ``state``
    ``started``/``done``), ``backfill`` (one route and table:
    ``last_key`` done so far as text values, ``state`` ``running``/``done``) or ``range``
    (one block range of a table an initial snapshot split, ``blocks`` ``[first, end)``, end
    -1: to the end, all its records in Kafka for every route; ``filenode`` the table's
    ``pg_relation_filenode`` then: a rewrite moves rows to other blocks). An ``initial``
    record's ``request`` names that snapshot (a slot dropped and created again under the
    same name starts another); its ``range`` records carry it."""

    kind: str
    slot: str
    state: str
    request: str = ""  # the request's id (a request seen again after a restart is known)
    route: str = ""
    table: str = ""
    last_key: tuple | None = None
    rows: int = 0
    #: a repair's keys (``Watermark.keys``): a resumed job reads only them
    keys: tuple[tuple, ...] = ()
    blocks: tuple[int, ...] = ()
    filenode: int = 0
    #: a ``signal`` record (``router.snapshot.signals``; keyed by slot and request): why it was
    #: refused (state ``refused``; ``accepted`` otherwise)
    problem: str = ""
    #: a ``backfill`` (or ``signal``) record's condition (a signal's ``where``): a resumed
    #: job reads only the rows it matches
    where: str = ""


_progress_decoder = msgspec.json.Decoder(SnapshotState)


def state_key(p: SnapshotState) -> bytes:
    """A JSON object, like every key pgrouter writes."""
    if p.kind == "initial":
        return msgspec.json.encode({"kind": "initial", "slot": p.slot})
    if p.kind == "signal":
        return msgspec.json.encode({"kind": "signal", "slot": p.slot, "request": p.request})
    if p.kind == "range":
        return msgspec.json.encode({"kind": "range", "slot": p.slot, "table": p.table,
                                    "blocks": p.blocks})
    return msgspec.json.encode({"kind": "backfill", "slot": p.slot, "route": p.route,
                                "table": p.table})


def encode_state(p: SnapshotState) -> tuple[bytes, bytes]:
    return state_key(p), msgspec.json.encode(p)


def decode_state(value: bytes | None) -> SnapshotState | None:
    if not value:
        return None
    try:
        return _progress_decoder.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


# -- chunk windows --------------------------------------------------------------------------


class ChunkWindow:
    """The stream between one chunk's low and high watermark, for one table: the keys it
    changed. ``key`` names the key columns; ``row_key`` their positions in the chunk's rows.
    A table without a key (``key`` empty) is copied whole: any change to it inside the window
    spoils the copy (``keep`` returns nothing and ``spoiled`` is set)."""

    __slots__ = ("table", "key", "row_key", "columns", "changed", "spoiled", "_indexes",
                 "latest", "moved", "_names")

    def __init__(self, table: tuple[str, str], key: tuple[str, ...], row_key: tuple[int, ...],
                 columns: tuple[str, ...] = ()):
        self.table = table
        self.key = key
        self.row_key = row_key
        #: the chunk rows' column names (to fill unchanged TOAST values from them)
        self.columns = columns
        self.changed: set[tuple] = set()
        self.spoiled = False
        self._indexes: tuple = (None, ())  # (relation, key indexes in its columns)
        #: key -> its latest new tuple in the window (None: deleted), in the stream's layout
        self.latest: dict[tuple, tuple | None] = {}
        #: key -> the key it had before an update moved it inside the window
        self.moved: dict[tuple, tuple] = {}
        self._names: tuple[str, ...] = ()

    def _key_indexes(self, relation) -> tuple[int, ...] | None:
        cached = self._indexes
        if cached[0] is relation:
            return cached[1]
        pos = {c.name: i for i, c in enumerate(relation.columns)}
        idx = tuple(pos[n] for n in self.key) if all(n in pos for n in self.key) else None
        self._indexes = (relation, idx)
        return idx

    def observe(self, op: str, relation, old: tuple | None, new: tuple | None,
                relations=None) -> None:
        """One change of the stream inside the window."""
        if op == "truncate":
            if any((r.namespace, r.name) == self.table for r in relations or ()):
                self.spoiled = True
            return
        if relation is None or (relation.namespace, relation.name) != self.table:
            return
        ki = self._key_indexes(relation)
        if not self.key or ki is None:
            self.spoiled = True
            return
        old_key = tuple(old[i] for i in ki) if old is not None else None
        new_key = tuple(new[i] for i in ki) if new is not None else None
        if old_key is not None:
            self.changed.add(old_key)
        if new_key is None:
            if old_key is not None:
                self.latest[old_key] = None
            return
        self.changed.add(new_key)
        prev = self.latest.get(old_key if old_key is not None else new_key)
        if prev is not None and len(prev) == len(new) and UNCHANGED_TOAST in new:
            new = tuple(p if v is UNCHANGED_TOAST else v for v, p in zip(new, prev))
        if old_key is not None and old_key != new_key:
            self.latest[old_key] = None
            self.moved[new_key] = self.moved.get(old_key, old_key)
        self.latest[new_key] = new
        self._names = tuple(c.name for c in relation.columns)

    def keep(self, rows: list[tuple]) -> list[tuple]:
        """The chunk rows the stream did not change inside the window."""
        if self.spoiled:
            return []
        if not self.changed:
            return rows
        rk, changed = self.row_key, self.changed
        kept = [r for r in rows if tuple(r[i] for i in rk) not in changed]
        return kept + self._filled(rows)

    def _filled(self, rows: list[tuple]) -> list[tuple]:
        """Rows of changed keys whose latest image lacks unchanged TOAST values, completed
        from the chunk row (see the module's rules)."""
        lacking = [(k, image) for k, image in self.latest.items()
                   if image is not None and UNCHANGED_TOAST in image]
        if not lacking or not self.columns:
            return []
        rk = self.row_key
        by_key = {tuple(r[i] for i in rk): r for r in rows}
        where = {n: i for i, n in enumerate(self._names)}
        out = []
        for k, image in lacking:
            row = by_key.get(k)
            if row is None and k in self.moved:
                row = by_key.get(self.moved[k])
            if row is None:
                continue  # not read by this chunk: its own chunk (or none) has it
            filled = []
            for i, name in enumerate(self.columns):
                j = where.get(name)
                v = image[j] if j is not None else UNCHANGED_TOAST
                filled.append(row[i] if v is UNCHANGED_TOAST else v)
            out.append(tuple(filled))
        return out


class RecentChanges:
    """The last ``limit`` changes of the tables being backfilled, with their transaction's
    xid, numbered in stream order.

    Why: PostgreSQL makes a transaction visible a moment after its commit record is written,
    so a transaction committed just before a low watermark can still be invisible to the
    chunk's read. Its changes are in the stream before the window; the chunk's read names it
    in its snapshot's in-progress list (``xip``), and ``replay`` feeds its changes to the
    window, so the rows it changed are dropped from the chunk like changes inside it."""

    __slots__ = ("changes", "count")

    def __init__(self, limit: int = 8192):
        self.changes: deque = deque(maxlen=limit)  # (number, xid, change)
        self.count = 0

    def add(self, xid: int, change) -> None:
        self.count += 1
        self.changes.append((self.count, xid, change))

    def replay(self, window: "ChunkWindow", upto: int, xids: frozenset[int]) -> None:
        """Changes numbered ``upto`` or lower of the transactions ``xids`` into ``window``."""
        if not xids:
            return
        for n, xid, change in self.changes:
            if n > upto:
                break
            if xid in xids:
                window.observe(change.op, change.relation, change.old, change.new,
                               change.relations)


def snapshot_xip(text: str) -> frozenset[int]:
    """The in-progress transactions of ``pg_current_snapshot()`` (``xmin:xmax:xip,…``, 64-bit
    xids) as the 32-bit xids the stream carries."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[2]:
        return frozenset()
    return frozenset(int(x) & 0xFFFFFFFF for x in parts[2].split(","))


# -- progress lines -------------------------------------------------------------------------


def eta(done: int, total: int, rate: float) -> float | None:
    """Seconds left at ``rate`` rows/s (None when unknown)."""
    if rate <= 0 or total <= 0:
        return None
    return max(0.0, (total - done) / rate)
