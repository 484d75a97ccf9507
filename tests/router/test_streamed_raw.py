"""A streamed transaction's row messages are kept as they came and decoded when it is read
(``router.stream.changes``): the same changes as decoding them one by one, each with the relation
in effect when it was sent, subtransaction aborts honoured in memory and after a spill, and
the memory they hold counted at what it costs."""

from __future__ import annotations

import gc
import struct
import tracemalloc

import pytest

import router.native
from router.pgoutput import Decoder
from router.stream.relations import RelationCache
from router.stream.transactions import Transaction, TransactionAssembler

RELID = 16384
XID = 700


def _relation(xid: int, columns: int) -> bytes:
    cols = b"\x01id\0" + struct.pack("!Ii", 20, -1)
    cols += b"".join(b"\x00c%d\0" % i + struct.pack("!Ii", 25, -1) for i in range(1, columns))
    return (b"R" + struct.pack("!II", xid, RELID) + b"public\0wide\0d"
            + struct.pack("!h", columns) + cols)


def _insert(xid: int, i: int, columns: int) -> bytes:
    values = [b"%d" % i] + [b"v%d-%d" % (i, c) for c in range(1, columns)]
    data = struct.pack("!H", columns) + b"".join(b"t" + struct.pack("!I", len(v)) + v
                                                 for v in values)
    return b"I" + struct.pack("!II", xid, RELID) + b"N" + data


def _start(first: bool) -> bytes:
    return b"S" + struct.pack("!IB", XID, 1 if first else 0)


def _abort(subxid: int) -> bytes:
    return b"A" + struct.pack("!II", XID, subxid)


def _commit() -> bytes:
    return b"c" + struct.pack("!IBQQq", XID, 0, 0x9000, 0x9008, 5)


def _stream(rows: int = 300) -> list[tuple[int, bytes]]:
    """Two stream blocks: rows of a 2-column relation (subxacts XID and XID+1), then the
    relation altered to 3 columns and more rows, the subxact XID+1 aborted, the commit."""
    msgs = [_start(True), _relation(XID, 2)]
    msgs += [_insert(XID + i % 2, i, 2) for i in range(rows)]
    msgs += [b"E", _start(False), _relation(XID, 3)]
    msgs += [_insert(XID, rows + i, 3) for i in range(rows)]
    msgs += [b"E", _abort(XID + 1), _commit()]
    return [(0x1000 + i, m) for i, m in enumerate(msgs)]


def _changes(txn: Transaction) -> list[tuple]:
    return [(c.op, c.lsn, len(c.relation.columns), c.new) for c in txn.changes]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("memory_limit", [64 * 1024 * 1024, 8192])
def test_streamed_rows_decoded_when_read_equal_one_by_one(tmp_path, monkeypatch, native,
                                                          memory_limit):
    if not native:
        monkeypatch.setattr(router.native, "NATIVE", None)
    msgs = _stream()
    kw = dict(memory_limit=memory_limit, spill_dir=str(tmp_path))
    one, batched = (TransactionAssembler(RelationCache(), **kw) for _ in range(2))
    decoder = Decoder(2)
    expected = [e for lsn, data in msgs for e in one.feed(lsn, decoder.decode(data))]
    decoder = Decoder(2)
    got = [e for i in range(0, len(msgs), 41)
           for e in batched.feed_batch(msgs[i:i + 41], decoder.decode)]
    (want,), (txn,) = expected, got
    assert _changes(txn) == _changes(want)
    # the aborted subxact's rows are gone, each row has the relation it was sent with
    assert txn.change_count == want.change_count == len(txn.changes) == 450
    assert [n for _, _, n, _ in _changes(txn)] == [2] * 150 + [3] * 300
    assert [c.new[0] for c in txn.changes][:3] == ["0", "2", "4"]
    assert batched.memory == one.memory == 0
    if memory_limit < 1024 * 1024:
        assert batched.spill_count > 0 and txn.changes.spilled
    # the router's view: the same changes as lists
    assert [c for run in txn.changes.runs() for c in run] == list(txn.changes)


def test_streamed_rows_are_counted_at_what_they_cost():
    a = TransactionAssembler(RelationCache(), memory_limit=1 << 40)
    decode = Decoder(2).decode
    a.feed_batch([(1, _start(True)), (2, _relation(XID, 2))], decode)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        rows = [(3 + i, _insert(XID, i, 2)) for i in range(40_000)]  # as the reader makes them
        a.feed_batch(rows, decode)
        del rows  # what stays is what the assembler holds
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert a.memory >= 0.85 * held, f"estimated {a.memory} bytes, they take {held}"
    assert a.memory <= 1.5 * held, f"estimated {a.memory} bytes, they take {held}"
