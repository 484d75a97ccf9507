"""Buffered changes of open transactions, in memory and spilled to disk.

Rules:

* A ``ChangeBuffer`` holds the changes of one open transaction with, for each, the
  (sub)transaction id it came from, so a subtransaction's changes can be dropped when it
  aborts — also after they were spilled (they are skipped on read-back).
* Memory is an estimate of what the Python objects take: ``CHANGE_OVERHEAD`` per change plus
  ``VALUE_OVERHEAD`` per value plus the bytes of the values (on the assembler's batch path:
  the bytes of the message that carried them). It must not undercount: ``memory_limit``
  bounds the resident memory of buffered transactions, narrow rows included.
* Only streamed transactions remember each change's subtransaction (only they can lose a
  subtransaction to Stream Abort); a normal transaction's changes all belong to its xid.
* Spilling appends the in-memory changes to an anonymous temporary file as msgpack frames of
  at most ``RUN_SIZE`` changes (4-byte length + payload), so reading back holds one small
  frame at a time, however much was spilled at once; relations are written as indexes into a per-buffer table, so a
  relation's layout is stored once, and ``UNCHANGED_TOAST`` as a msgpack extension.
  ``Changes`` reads the frames back on every iteration, so memory stays bounded downstream.
* A streamed transaction's plain row messages (Insert/Update/Delete inside Stream Start …
  Stop) are kept as they came (``raw``: the (lsn, payload) pairs, payload with its
  subtransaction xid) and decoded only when the transaction is read, in runs of
  ``RUN_SIZE`` (in C: ``router._native.feed_rows`` with ``skip=4``); spilled, they go to the
  file as they are, in frames that name the relation map they are decoded with (a copy of
  the relation cache taken at the spill). Before a Relation or Type message changes the
  cache, and before any other change joins the buffer, the raw messages are decoded
  (``materialize``), so every change keeps the relation in effect when it was sent.
* This is the one place the core touches a file; the assembler decides when.
"""

from __future__ import annotations

import itertools
import struct
import tempfile
from typing import Iterator, Literal

import msgspec

from ..errors import ProtocolViolation
from ..pgoutput import messages as m

#: Bytes a change costs in memory beyond its message's bytes: the Change, its list slot, its
#: LSN and the tuple (CPython 3.11, 64 bit), less the message's own header bytes.
CHANGE_OVERHEAD = 168
#: Bytes a value costs beyond the bytes the message spends on it (kind + length + data):
#: the str/bytes object's header and its slot in the tuple. Narrow rows are mostly this.
VALUE_OVERHEAD = 52


class Change(msgspec.Struct, frozen=True, gc=False):
    """One change of a transaction. ``old`` is the key-only tuple (``old_is_key``) or the full
    old row (REPLICA IDENTITY FULL); ``relations``/``options`` for truncate, ``message`` for
    a transactional logical message."""

    op: Literal["insert", "update", "delete", "truncate", "message"]
    lsn: int
    relation: m.Relation | None = None
    old: tuple | None = None
    old_is_key: bool = False
    new: tuple | None = None
    relations: tuple[m.Relation, ...] | None = None
    options: int = 0
    message: m.Message | None = None


def row_change(lsn: int, msg, relation: m.Relation) -> Change:
    """The Change of an Insert, Update or Delete message: ``old`` is the key-only tuple
    (``old_is_key``) when the message has one, else the full old row, if any."""
    if type(msg) is m.Insert:
        return Change("insert", lsn, relation, None, False, msg.new)
    key = msg.key
    old = msg.old if key is None else key
    if type(msg) is m.Update:
        return Change("update", lsn, relation, old, key is not None, msg.new)
    return Change("delete", lsn, relation, old, key is not None)


_UNCHANGED_EXT = 1
_FRAME = struct.Struct("!I")
#: a frame of raw streamed row messages has this bit set in its length
_RAW_FRAME = 0x80000000
#: Bytes a raw (lsn, payload) pair costs beyond its payload's bytes: the tuple, the LSN int,
#: the bytes object's header and its list slot (CPython 3.11, 64 bit), rounded up.
RAW_OVERHEAD = 144
_ROW_TYPES = frozenset(b"IUD")
_XID = struct.Struct("!I").unpack_from


def _enc_hook(obj):
    if obj is m.UNCHANGED_TOAST:
        return msgspec.msgpack.Ext(_UNCHANGED_EXT, b"")
    raise TypeError(f"cannot spill {type(obj).__name__}")


def _ext_hook(code: int, data: memoryview):
    if code == _UNCHANGED_EXT:
        return m.UNCHANGED_TOAST
    raise ValueError(f"unknown spill extension {code}")


_encode = msgspec.msgpack.Encoder(enc_hook=_enc_hook).encode
_decode = msgspec.msgpack.Decoder(ext_hook=_ext_hook).decode
_decode_raw_frame = msgspec.msgpack.Decoder(tuple[int, list[tuple[int, bytes]]]).decode


def take_raw(messages: list, i: int, raw: list, budget: int) -> tuple[int, int]:
    """From ``messages[i]`` on, the streamed Insert/Update/Delete messages appended to
    ``raw`` as they are, up to the first other message or the one that takes the estimate
    past ``budget``; returns (next index, bytes estimated)."""
    used, n, append, rows = 0, len(messages), raw.append, _ROW_TYPES
    while i < n and used <= budget:
        item = messages[i]
        payload = item[1]
        if payload[0] not in rows or len(payload) < 10:
            break
        append(item)
        used += len(payload) + RAW_OVERHEAD
        i += 1
    return i, used


def decode_raw(entries: list, relations: dict) -> list[Change]:
    """The Changes of raw streamed row messages, decoded with ``relations`` (id -> Relation)."""
    from ..native import NATIVE
    from ..pgoutput.decode import DATA_DECODERS

    out: list[Change] = []
    i, n = 0, len(entries)
    while i < n:
        if NATIVE is not None:
            i = NATIVE.feed_rows(entries, i, out, relations, Change, 0, 0, 1 << 62, 4)[0]
            if i >= n:
                break
        lsn, payload = entries[i]  # not the plain case: the Python decoder (or its error)
        msg = DATA_DECODERS[payload[0]](payload, 5, _XID(payload, 1)[0])
        relation = relations.get(msg.relation_id)
        if relation is None:
            raise ProtocolViolation(f"change for relation {msg.relation_id} before its "
                                    "Relation message")
        out.append(row_change(lsn, msg, relation))
        i += 1
    return out


def _raw_subxid(entry) -> int:
    return _XID(entry[1], 1)[0]


def _payload(values: tuple | None) -> int:
    if values is None:
        return 0
    fixed = (VALUE_OVERHEAD + 5) * len(values)  # + kind and length, as in the message
    try:  # once per change: text/binary values in C; filter drops the NULLs
        return fixed + sum(map(len, filter(None, values)))
    except TypeError:  # an unchanged-TOAST marker has no length
        return fixed + sum(len(v) for v in values if type(v) is str or type(v) is bytes)


class ChangeBuffer:
    """Changes of one open transaction, in memory and (after spilling) in a file."""

    __slots__ = ("xid", "final_lsn", "origin_name", "origin_lsn", "gid", "streamed",
                 "changes", "subxids", "memory", "file", "relations", "relation_index",
                 "aborted", "subxid_counts", "count", "raw", "epochs", "commit_time",
                 "released", "parts")

    def __init__(self, xid: int, final_lsn: int = 0, gid: str | None = None,
                 streamed: bool = False):
        self.xid, self.final_lsn, self.gid, self.streamed = xid, final_lsn, gid, streamed
        self.origin_name: str | None = None
        self.origin_lsn: int | None = None
        self.changes: list[Change] = []
        self.subxids: list[int] = []
        self.memory = 0
        self.count = 0
        self.file = None
        self.relations: list[m.Relation] = []
        self.relation_index: dict[int, int] = {}
        self.aborted: set[int] = set()
        self.subxid_counts: dict[int, int] = {}
        #: streamed row messages not decoded yet, after every change in ``changes``
        self.raw: list[tuple[int, bytes]] = []
        #: relation maps raw spill frames are decoded with
        self.epochs: list[dict] = []
        #: Begin's commit time; changes released before in parts; whether it may still be
        #: (``TransactionAssembler._part``)
        self.commit_time, self.released, self.parts = 0, 0, False

    def materialize(self, relations: dict) -> int:
        """Decode the raw messages into ``changes``; returns the change of the estimate."""
        raw, self.raw = self.raw, []
        if not raw:
            return 0
        changes = decode_raw(raw, relations)
        before = sum(len(p) + RAW_OVERHEAD for _, p in raw)
        after = sum(change_size(c) for c in changes)
        self.changes += changes
        self.subxids += map(_raw_subxid, raw)
        for subxid in map(_raw_subxid, raw):
            self.subxid_counts[subxid] = self.subxid_counts.get(subxid, 0) + 1
        self.memory += after - before
        return after - before

    def add(self, change: Change, subxid: int, size: int) -> None:
        self.changes.append(change)
        self.memory += size
        self.count += 1
        if self.streamed:
            self.subxids.append(subxid)
            self.subxid_counts[subxid] = self.subxid_counts.get(subxid, 0) + 1

    def abort_subxact(self, subxid: int) -> int:
        """Drop ``subxid``'s changes; returns the memory released."""
        self.aborted.add(subxid)
        self.count -= self.subxid_counts.pop(subxid, 0)
        released = 0
        if self.raw:
            raw = [e for e in self.raw if _raw_subxid(e) != subxid]
            gone = sum(len(p) + RAW_OVERHEAD for _, p in self.raw) - sum(
                len(p) + RAW_OVERHEAD for _, p in raw)
            self.count -= len(self.raw) - len(raw)
            self.raw, self.memory, released = raw, self.memory - gone, gone
        if self.epochs:  # raw messages were spilled: they are not in subxid_counts
            self.count -= self._spilled_raw(subxid)
        keep = [i for i, s in enumerate(self.subxids) if s != subxid]
        if len(keep) == len(self.subxids):
            return released
        before = self.memory
        self.changes = [self.changes[i] for i in keep]
        self.subxids = [self.subxids[i] for i in keep]
        self.memory = sum(change_size(c) for c in self.changes) + sum(
            len(p) + RAW_OVERHEAD for _, p in self.raw)
        return released + before - self.memory

    def _spilled_raw(self, subxid: int) -> int:
        """How many spilled raw messages belong to ``subxid``."""
        f, n = self.file, 0
        f.flush()
        f.seek(0)
        while header := f.read(4):
            size = _FRAME.unpack(header)[0]
            blob = f.read(size & ~_RAW_FRAME)
            if size & _RAW_FRAME:
                n += sum(_raw_subxid(e) == subxid for e in _decode_raw_frame(blob)[1])
        f.seek(0, 2)
        return n

    def spill(self, spill_dir: str | None, relations: dict | None = None) -> int:
        """Append the in-memory changes, then the raw messages (decoded with ``relations``
        when read), to the spill file; returns the memory released."""
        if not self.changes and not self.raw:
            return 0
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="pgrouter-txn-", dir=spill_dir)
        subxids = self.subxids if self.streamed else itertools.repeat(self.xid)
        pairs = zip(self.changes, subxids)
        write = self.file.write
        self.file.seek(0, 2)
        record = self._record
        # frames of RUN_SIZE changes: reading one back decodes no more than that at a time
        while frame := [record(c, s) for c, s in itertools.islice(pairs, RUN_SIZE)]:
            blob = _encode(frame)
            write(_FRAME.pack(len(blob)))
            write(blob)
        if self.raw:  # after the decoded changes, which precede them
            if not self.epochs or self.epochs[-1] != relations:
                self.epochs.append(dict(relations or {}))
            epoch, raw = len(self.epochs) - 1, self.raw
            for start in range(0, len(raw), RUN_SIZE):
                blob = _encode((epoch, raw[start:start + RUN_SIZE]))
                write(_FRAME.pack(len(blob) | _RAW_FRAME))
                write(blob)
        released, self.memory = self.memory, 0
        self.changes, self.subxids, self.raw = [], [], []
        return released

    def _rel(self, relation: m.Relation | None) -> int:
        if relation is None:
            return -1
        index = self.relation_index.get(id(relation))
        if index is None:
            index = self.relation_index[id(relation)] = len(self.relations)
            self.relations.append(relation)
        return index

    def _record(self, c: Change, subxid: int) -> list:
        msg = c.message
        return [subxid, c.op, c.lsn, self._rel(c.relation), c.old, c.old_is_key, c.new,
                None if c.relations is None else [self._rel(r) for r in c.relations],
                c.options,
                None if msg is None else [msg.transactional, msg.message_lsn, msg.prefix,
                                          msg.content, msg.xid]]

    def release(self, relations: dict | None = None) -> Changes:
        """The changes; ``relations`` (the relation cache's map) decodes the raw ones."""
        raw = (self.raw, dict(relations or {})) if self.raw else None
        return Changes(self.changes, self.subxids, self.file, tuple(self.relations),
                       frozenset(self.aborted), self.count, raw, tuple(self.epochs))


def row_size(c: Change, message_bytes: int) -> int:
    """The estimate for a row change from the size of the message that carried it
    (``router._native.feed_rows`` counts the same)."""
    values = (0 if c.old is None else len(c.old)) + (0 if c.new is None else len(c.new))
    return CHANGE_OVERHEAD + message_bytes + VALUE_OVERHEAD * values


def change_size(c: Change) -> int:
    return CHANGE_OVERHEAD + _payload(c.old) + _payload(c.new)


#: changes per list ``Changes.runs`` yields from a spill file
RUN_SIZE = 4096


class Changes:
    """The changes of a released transaction, in order; iterable any number of times.
    Spilled changes are read back from the file on each iteration, raw streamed row
    messages decoded on each iteration, ``RUN_SIZE`` at a time."""

    __slots__ = ("_memory", "_subxids", "_file", "_relations", "_aborted", "_count", "_raw",
                 "_epochs")

    def __init__(self, memory, subxids, file, relations, aborted, count, raw=None,
                 epochs=()):
        self._memory, self._subxids, self._file = memory, subxids, file
        self._relations, self._aborted, self._count = relations, aborted, count
        #: (raw messages after ``memory``, the relation map they are decoded with) or None
        self._raw, self._epochs = raw, epochs

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Change]:
        for run in self.runs():
            yield from run

    def in_memory(self) -> list[Change] | None:
        """The changes as the list they are in (not a copy), when all of them are in memory,
        decoded, and none was aborted; else None."""
        return (self._memory if self._file is None and not self._aborted
                and self._raw is None else None)

    def runs(self) -> Iterator[list[Change]]:
        """The changes in order as lists: what is in memory as one list (not a copy), what
        was spilled or kept raw in lists of up to ``RUN_SIZE``."""
        if self._file is not None:
            yield from self._read_spilled()
        if self._aborted:
            run = [change for change, subxid in zip(self._memory, self._subxids)
                   if subxid not in self._aborted]
            if run:
                yield run
        elif self._memory:
            yield self._memory
        if self._raw is not None:
            raw, relations = self._raw
            for start in range(0, len(raw), RUN_SIZE):
                run = self._decode_raw(raw[start:start + RUN_SIZE], relations)
                if run:
                    yield run

    def _decode_raw(self, entries: list, relations: dict) -> list[Change]:
        if self._aborted:
            entries = [e for e in entries if _raw_subxid(e) not in self._aborted]
        return decode_raw(entries, relations)

    def _read_spilled(self) -> Iterator[list[Change]]:
        """The spilled frames, one list each."""
        f, rels, aborted = self._file, self._relations, self._aborted
        f.seek(0)
        while header := f.read(4):
            size = _FRAME.unpack(header)[0]
            blob = f.read(size & ~_RAW_FRAME)
            if size & _RAW_FRAME:
                epoch, entries = _decode_raw_frame(blob)
                run = self._decode_raw(entries, self._epochs[epoch])
            else:
                run = [Change(
                    op, lsn, None if rel < 0 else rels[rel],
                    None if old is None else tuple(old), old_is_key,
                    None if new is None else tuple(new),
                    None if trel is None else tuple(rels[i] for i in trel), options,
                    None if msg is None else m.Message(*msg))
                    for (subxid, op, lsn, rel, old, old_is_key, new, trel, options, msg)
                    in _decode(blob) if subxid not in aborted]
            if run:
                yield run

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


