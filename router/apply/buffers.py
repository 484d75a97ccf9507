"""Where the applier keeps a transaction's records until it is released
(``router.apply.reassembly``): per partition, in memory or, once spilled, in a temporary file.

Rules: a partition's records are kept in arrival order, which is change order (``seq``) as
the router writes one partition; a spilled partition is a file of length-prefixed JSON
records read back one at a time; ``Records`` merges a transaction's partitions by ``seq``.
"""

from __future__ import annotations

import heapq
import tempfile
from itertools import repeat
from typing import Iterator

import msgspec

from .records import DataRecord, _decode_data

#: bytes a decoded record holds besides its encoded value (its structs and strings; the
#: value itself stays referenced by the undecoded rows), measured with tracemalloc
RECORD_OVERHEAD = 800

_encode = msgspec.json.Encoder().encode


def _seq(rec: DataRecord) -> int:
    return rec.source.seq


def _topic_seq(topic_rec: tuple[str, DataRecord]) -> int:
    return topic_rec[1].source.seq


class _Part:
    """One partition's records of one transaction, in arrival order: in memory, or in a
    temporary file of length-prefixed JSON records once spilled."""

    __slots__ = ("topic", "records", "file", "count", "ordered", "last_seq", "tables")

    def __init__(self, topic: str):
        self.topic = topic
        self.tables: set[tuple[str | None, str | None]] = set()
        self.records: list[DataRecord] = []
        self.file = None
        self.count = 0
        self.ordered = True
        self.last_seq = -1

    def spill(self, spill_dir: str | None) -> None:
        self.file = tempfile.TemporaryFile(prefix="pgrouter-apply-", dir=spill_dir)
        for rec in self.records:
            self.append(_encode(rec))
        self.records = []

    def append(self, value: bytes) -> None:
        self.file.write(len(value).to_bytes(4, "little"))
        self.file.write(value)

    def __iter__(self) -> Iterator[tuple[str, DataRecord]]:
        """``(topic, record)`` in change order."""
        if self.file is None:
            recs = self.records if self.ordered else sorted(self.records, key=_seq)
        else:
            f = self.file
            f.flush()
            f.seek(0)
            recs = self._read(f)
            if not self.ordered:  # never seen: the router writes a partition in change order
                recs = sorted(recs, key=_seq)
        # pairs made in C, not by a generator's frame a record
        return zip(repeat(self.topic), recs)

    @staticmethod
    def _read(f) -> Iterator[DataRecord]:
        while True:
            head = f.read(4)
            if not head:
                return
            yield _decode_data(f.read(int.from_bytes(head, "little")))

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class Records:
    """A released transaction's records in change order; iterable more than once (one
    iteration at a time), reading spilled partitions back from disk."""

    def __init__(self, parts: list[_Part]):
        self._parts = parts
        self.spilled = any(p.file is not None for p in parts)

    def __iter__(self) -> Iterator[tuple[str, DataRecord]]:
        if len(self._parts) == 1:
            return iter(self._parts[0])
        return heapq.merge(*self._parts, key=_topic_seq)

    def close(self) -> None:
        for p in self._parts:
            p.close()


class _Buffer:
    __slots__ = ("parts", "memory", "first_offsets")

    def __init__(self):
        self.parts: dict[tuple[str, int], _Part] = {}
        self.memory = 0
        self.first_offsets: dict[tuple[str, int], int] = {}
