"""What a huge transaction costs the assembler in memory: buffered changes are counted at
what their Python objects take (so ``memory_limit`` bounds real memory, narrow rows
included), and a spilled transaction is read back a frame of at most ``RUN_SIZE`` changes at
a time, however much was spilled at once."""

from __future__ import annotations

import gc
import struct
import tracemalloc

from router.stream.changes import RUN_SIZE
from router.pgoutput import Decoder
from router.stream.relations import RelationCache
from router.stream.transactions import Transaction, TransactionAssembler

MIB = 1024 * 1024
RELID = 16384


def _relation() -> bytes:
    cols = (b"\x01id\0" + struct.pack("!Ii", 20, -1)) + (b"\x00n\0" + struct.pack("!Ii", 23, -1))
    return b"R" + struct.pack("!I", RELID) + b"public\0narrow\0d" + struct.pack("!h", 2) + cols


def _insert(i: int) -> bytes:
    values = [b"%d" % (10_000_000 + i), b"%d" % (i % 1000)]
    data = struct.pack("!H", 2) + b"".join(b"t" + struct.pack("!I", len(v)) + v
                                           for v in values)
    return b"I" + struct.pack("!I", RELID) + b"N" + data


def _messages(rows: int, commit: bool) -> list[tuple[int, bytes]]:
    final = 0x50000000
    msgs = [_relation(), b"B" + struct.pack("!QqI", final, 7, 900)]
    msgs += [_insert(i) for i in range(rows)]
    if commit:
        msgs.append(b"C" + struct.pack("!BQQq", 0, final, final + 8, 9))
    return [(0x10000000 + i, m) for i, m in enumerate(msgs)]


def _traced(fn) -> tuple[object, int, int]:
    """(fn's result, bytes still allocated after it, peak bytes while it ran)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = fn()
        now, peak = tracemalloc.get_traced_memory()
        return out, now - before, peak - before
    finally:
        tracemalloc.stop()


def test_buffered_changes_are_counted_at_what_they_cost():
    msgs = _messages(40_000, commit=False)
    a = TransactionAssembler(RelationCache(), memory_limit=1 << 40, part_changes=None)
    decode = Decoder(1).decode
    _, held, _ = _traced(lambda: a.feed_batch(msgs, decode))
    # every change is still buffered (no commit): the estimate must not undercount them
    assert a.memory >= 0.85 * held, f"estimated {a.memory} bytes, they take {held}"
    assert a.memory <= 1.5 * held, f"estimated {a.memory} bytes, they take {held}"


def test_spilled_transaction_is_read_back_a_frame_at_a_time(tmp_path):
    msgs = _messages(150_000, commit=True)
    a = TransactionAssembler(RelationCache(), memory_limit=16 * MIB, spill_dir=str(tmp_path))
    (txn,) = [e for e in a.feed_batch(msgs, Decoder(1).decode) if type(e) is Transaction]
    assert txn.changes.spilled and a.spill_count >= 1

    def read_back() -> int:
        count = 0
        for run in txn.changes.runs():
            assert len(run) <= 150_000
            count += len(run)
        return count

    count, _, peak = _traced(read_back)
    assert count == 150_000
    # a frame of RUN_SIZE narrow changes decodes to a few MiB; one frame per spill (everything
    # buffered up to memory_limit at once) took several times memory_limit to read back
    assert peak < 6 * MIB + RUN_SIZE * 1024, f"{peak / MIB:.1f} MiB to read back"
