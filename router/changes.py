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
* This is the one place the core touches a file; the assembler decides when.
"""

from __future__ import annotations

import itertools
import struct
import tempfile
from typing import Iterator, Literal

import msgspec

from .pgoutput import messages as m

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
                 "aborted", "subxid_counts", "count")

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
        keep = [i for i, s in enumerate(self.subxids) if s != subxid]
        if len(keep) == len(self.subxids):
            return 0
        before = self.memory
        self.changes = [self.changes[i] for i in keep]
        self.subxids = [self.subxids[i] for i in keep]
        self.memory = sum(change_size(c) for c in self.changes)
        return before - self.memory

    def spill(self, spill_dir: str | None) -> int:
        """Append the in-memory changes to the spill file; returns the memory released."""
        if not self.changes:
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
        released, self.memory = self.memory, 0
        self.changes, self.subxids = [], []
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

    def release(self) -> Changes:
        return Changes(self.changes, self.subxids, self.file, tuple(self.relations),
                       frozenset(self.aborted), self.count)


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
    Spilled changes are read back from the file on each iteration."""

    __slots__ = ("_memory", "_subxids", "_file", "_relations", "_aborted", "_count")

    def __init__(self, memory, subxids, file, relations, aborted, count):
        self._memory, self._subxids, self._file = memory, subxids, file
        self._relations, self._aborted, self._count = relations, aborted, count

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Change]:
        if self._file is not None:
            yield from self._read_spilled()
        if self._aborted:
            for change, subxid in zip(self._memory, self._subxids):
                if subxid not in self._aborted:
                    yield change
        else:
            yield from self._memory

    def in_memory(self) -> list[Change] | None:
        """The changes as the list they are in (not a copy), when all of them are in memory
        and none was aborted; else None."""
        return self._memory if self._file is None and not self._aborted else None

    def runs(self) -> Iterator[list[Change]]:
        """The changes in order as lists: what is in memory as one list (not a copy), what
        was spilled in lists of up to ``RUN_SIZE``."""
        if self._file is not None:
            run: list[Change] = []
            for change in self._read_spilled():
                run.append(change)
                if len(run) >= RUN_SIZE:
                    yield run
                    run = []
            if run:
                yield run
        if self._aborted:
            yield [change for change, subxid in zip(self._memory, self._subxids)
                   if subxid not in self._aborted]
        elif self._memory:
            yield self._memory

    def _read_spilled(self) -> Iterator[Change]:
        f, rels, aborted = self._file, self._relations, self._aborted
        f.seek(0)
        while header := f.read(4):
            blob = f.read(_FRAME.unpack(header)[0])
            for (subxid, op, lsn, rel, old, old_is_key, new, trel, options,
                 msg) in _decode(blob):
                if subxid in aborted:
                    continue
                yield Change(
                    op, lsn, None if rel < 0 else rels[rel],
                    None if old is None else tuple(old), old_is_key,
                    None if new is None else tuple(new),
                    None if trel is None else tuple(rels[i] for i in trel), options,
                    None if msg is None else m.Message(*msg))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


