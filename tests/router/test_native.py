"""``router._native`` against its Python twins (``router/native.py``): the Python code is the
reference, the C code returns None wherever its input is not the plain case, and whatever it
does return is exactly what the Python code computes. Differential tests over the golden
captures and over generated, truncated and mutated input; they skip when the accelerator is
off (``make test`` also runs tests/router with PGROUTER_PURE_PYTHON=1), the build test never."""

from __future__ import annotations

import functools
import os
import pathlib
import random
import struct

import pytest

from router.errors import DecodeError, ProtocolViolation, TrailingBytes, TruncatedMessage
from router.native import NATIVE
from router.pgoutput import UNCHANGED_TOAST as U
from router.pgoutput import Decoder, Delete, Insert, Update
from router.pgoutput.reader import MAX_COLUMNS, read_tuple, read_tuple_py
from router.pgoutput.render import parse_line
from router.stream.relations import RelationCache
from router.stream.transactions import Transaction, TransactionAssembler

GOLDEN = pathlib.Path(__file__).resolve().parent / "pgoutput" / "golden"
CAPTURES = {"v1_text.tsv": 1, "v1_binary.tsv": 1, "v2_stream.tsv": 2, "v3_twophase.tsv": 3}
PURE = os.environ.get("PGROUTER_PURE_PYTHON", "") not in ("", "0")
native = pytest.mark.skipif(NATIVE is None, reason="router._native off (PGROUTER_PURE_PYTHON=1)")


def outcome(fn, *args):
    """What a call did, comparable across implementations: its result or its error."""
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 - the type and text are what is compared
        return "raised", type(exc), str(exc), getattr(exc, "offset", None)


def test_native_is_built():
    if PURE:
        assert NATIVE is None, "PGROUTER_PURE_PYTHON=1 must turn the accelerator off"
    else:
        assert NATIVE is not None, "router._native is not built: pip install -e . with gcc"


# --- pgoutput bytes ------------------------------------------------------------------------


def tuple_data(values) -> bytes:
    out = [struct.pack("!H", len(values))]
    for v in values:
        if v is None or v is U:
            out.append(b"n" if v is None else b"u")
        else:
            raw = v if type(v) is bytes else v.encode()
            out.append((b"b" if type(v) is bytes else b"t") + struct.pack("!I", len(raw)) + raw)
    return b"".join(out)


def row_msg(kind: bytes, relid: int, *parts) -> bytes:
    """An Insert/Update/Delete: ``parts`` are (marker, values), e.g. (b"K", key), (b"N", new)."""
    return kind + struct.pack("!I", relid) + b"".join(m + tuple_data(v) for m, v in parts)


def load(name: str) -> list[tuple[int, bytes]]:
    lines = (GOLDEN / name).read_text().splitlines()
    return [r for r in (parse_line(line, n) for n, line in enumerate(lines, 1)) if r is not None]


GOLDEN_ROWS = {name: load(name) for name in CAPTURES}


def golden_messages():
    """(data, decoded message, the decoder's row_decoder() before it) of every captured
    message, and whether it was inside a stream block."""
    for name, version in CAPTURES.items():
        decoder = Decoder(version)
        for _, data in GOLDEN_ROWS[name]:
            in_stream, row_decoder = decoder.in_stream, decoder.row_decoder()
            yield data, decoder.decode(data), row_decoder, in_stream


@functools.cache
def golden_tuples() -> tuple[tuple[bytes, int], ...]:
    """(message, offset) of every TupleData in the captures."""
    found = []
    for data, msg, _, _ in golden_messages():
        if type(msg) in (Insert, Update, Delete):
            pos = 6 if msg.xid is None else 10
            end = read_tuple_py(data, pos)[1]
            found += [(data, pos)] + ([(data, end + 1)] if end < len(data) else [])
    return tuple(found)


CHARS = ["a", "é", "ü", "✓", "😀", "𝄞", "\x01", "\t", "\n", "\x1f", "\x7f", '"', "\\", "%"]


def rand_text(rng, size=None) -> str:
    return "".join(rng.choices(CHARS, k=rng.randint(0, 12) if size is None else size))


def rand_tuple(rng, n: int | None = None) -> tuple:
    n = rng.choice([0, 1, 2, 3, 7, 20, rng.randint(100, 400)]) if n is None else n
    pick = [lambda: None, lambda: U, lambda: rand_text(rng), lambda: "",
            lambda: rng.randbytes(rng.randint(0, 9)), lambda: rand_text(rng) + "\x00"]
    return tuple(rng.choice(pick)() for _ in range(n))


def mutate(rng, data: bytes, start: int) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if len(out) > start:
            out[rng.randrange(start, len(out))] = rng.choice(
                [rng.randrange(256), 0, 0xFF, 0x80, *b"tnubNKO"])
    return bytes(out)


def prefixes(rng, data: bytes, start: int, most: int = 200):
    """Every truncation of data after start, or ``most`` random ones."""
    cuts = range(start, len(data))
    return [data[:k] for k in (cuts if len(cuts) <= most else rng.sample(cuts, most))]


# --- read_tuple ----------------------------------------------------------------------------


def check_read_tuple(data: bytes, pos: int) -> bool:
    """C result == Python result; None exactly where Python raises. True: it was valid."""
    got = NATIVE.read_tuple(data, pos)
    try:
        want = read_tuple_py(data, pos)
    except DecodeError:
        assert got is None, (data.hex(), pos, got)
        return False
    assert got == want, (data.hex(), pos)
    assert [type(v) for v in got[0]] == [type(v) for v in want[0]]
    return True


@native
def test_read_tuple_on_truncated_and_mutated_tuples():
    rng = random.Random(2)
    golden = golden_tuples()
    bases = rng.sample(golden, 100) + [(tuple_data(rand_tuple(rng)), 0) for _ in range(100)]
    valid = invalid = 0
    for data, pos in bases:
        variants = prefixes(rng, data, pos) + [mutate(rng, data, pos) for _ in range(15)]
        for variant in variants:
            ok = check_read_tuple(variant, pos)
            valid, invalid = valid + ok, invalid + (not ok)
    assert valid > 300 and invalid > 3000


BAD_UTF8 = [b"\xff", b"\xc3", b"a\xe2\x82", b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80"]


@native
@pytest.mark.parametrize("raw", BAD_UTF8)
def test_read_tuple_invalid_utf8_is_left_to_python(raw):
    data = struct.pack("!H", 2) + b"n" + b"t" + struct.pack("!I", len(raw)) + raw
    assert NATIVE.read_tuple(data, 0) is None
    with pytest.raises(DecodeError, match="not valid UTF-8"):
        read_tuple_py(data, 0)
    assert NATIVE.read_tuple(data.replace(b"t", b"b", 1), 0) == ((None, raw), len(data))


@native
def test_read_tuple_column_limit():
    at_limit = struct.pack("!H", MAX_COLUMNS) + b"n" * MAX_COLUMNS
    want = ((None,) * MAX_COLUMNS, len(at_limit))
    assert NATIVE.read_tuple(at_limit, 0) == read_tuple_py(at_limit, 0) == want
    for count in (MAX_COLUMNS + 1, 0x8000, 0xFFFF):
        data = struct.pack("!H", count) + b"n" * count
        assert NATIVE.read_tuple(data, 0) is None
        assert outcome(read_tuple_py, data, 0)[1] is DecodeError


def test_public_read_tuple_raises_what_read_tuple_py_raises():
    rng = random.Random(3)
    raised = 0
    for data, pos in rng.sample(golden_tuples(), 40):
        for variant in prefixes(rng, data, pos)[:60] + [mutate(rng, data, pos) for _ in range(20)]:
            want = outcome(read_tuple_py, variant, pos)
            assert outcome(read_tuple, variant, pos) == want, variant.hex()
            raised += want[0] == "raised"
    assert raised > 1000


# --- decode_row ----------------------------------------------------------------------------


def check_decode_row(data: bytes) -> bool:
    got = NATIVE.decode_row(data)
    try:
        want = Decoder(4).decode(data)
    except DecodeError:
        assert got is None, data.hex()
        return False
    if type(want) in (Insert, Update, Delete):
        assert type(got) is type(want) and got == want, data.hex()
        return True
    assert got is None, data.hex()
    return False


#: Insert, Update N/K/O, Delete K/O: the message type and its tuple markers
ROW_FORMS = [(b"I", b"N"), (b"U", b"N"), (b"U", b"KN"), (b"U", b"ON"), (b"D", b"K"), (b"D", b"O")]


def rand_row_msg(rng, relid: int, form, width: int | None = None) -> bytes:
    kind, markers = form
    return row_msg(kind, relid, *((bytes([m]), rand_tuple(rng, width)) for m in markers))


@native
def test_decode_row_on_golden_messages_and_row_decoder_state():
    rows = others = 0
    for data, msg, row_decoder, in_stream in golden_messages():
        assert row_decoder is (None if in_stream else NATIVE.decode_row)
        if in_stream and type(msg) in (Insert, Update, Delete):
            data = data[:1] + data[5:]  # the same change without the streamed xid
        elif in_stream:
            continue
        ok = check_decode_row(data)
        rows, others = rows + ok, others + (not ok)
    assert rows > 4000 and others > 100


def test_row_decoder_is_none_inside_a_stream_block():
    decoder = Decoder(2)
    plain = None if NATIVE is None else NATIVE.decode_row
    assert decoder.row_decoder() is plain
    decoder.decode(b"S" + struct.pack("!IB", 7, 1))
    assert decoder.in_stream and decoder.row_decoder() is None
    decoder.decode(b"E")
    assert decoder.row_decoder() is plain


@native
def test_decode_row_on_generated_malformed_and_foreign_messages():
    rng = random.Random(4)
    valid = invalid = 0
    for relid in [0, 1, 16384, 2**31, 2**32 - 1] * 6:
        for msg in (rand_row_msg(rng, relid, form) for form in ROW_FORMS):
            variants = [msg, msg + b"\x00", msg + b"N", msg[:5] + b"X" + msg[6:],
                        b"D" + msg[1:5] + b"N" + msg[6:], *prefixes(rng, msg, 0, 40),
                        *(mutate(rng, msg, 0) for _ in range(10))]
            for data in variants:
                ok = check_decode_row(data)
                valid, invalid = valid + ok, invalid + (not ok)
    assert valid > 180 and invalid > 5000
    for data in [b"B" + bytes(20), b"R", b"", b"I", b"Y\x00\x00\x00\x01x\x00y\x00"]:
        assert NATIVE.decode_row(data) is None


# --- feed_batch: runs of row changes in C (feed_rows) or in Python (_feed_row) -------------


def relation_msg(relid: int, width: int) -> bytes:
    cols = b"".join(bytes([i == 0]) + b"c%d\0" % i + struct.pack("!Ii", 25, -1)
                    for i in range(width))
    return (b"R" + struct.pack("!I", relid) + b"public\0t%d\0d" % relid
            + struct.pack("!h", width) + cols)


def gen_stream(rng, transactions: int, poison: bytes | None = None) -> list[tuple[int, bytes]]:
    """Begin ... Commit around runs of row changes: many small transactions, some large ones,
    a relation altered and a logical message in the middle of some; ``poison`` goes into the
    middle of the middle transaction."""
    widths = {16384: 3, 16385: 12}
    msgs = [relation_msg(r, w) for r, w in widths.items()]
    for xid in range(1000, 1000 + transactions):
        final = 0x10000000 + xid * 0x1000
        msgs.append(b"B" + struct.pack("!QqI", final, 7, xid))
        size = rng.choice([1, 1, 1, 2, 3, 5, 40, 300 if poison is None else 10])
        for k in range(size):
            if rng.random() < 0.01:
                widths[16385] = rng.randint(1, 30)
                msgs.append(relation_msg(16385, widths[16385]))
            if rng.random() < 0.01:
                msgs.append(b"M" + struct.pack("!BQ", 1, final) + b"p\0\0\0\0\x03abc")
            relid = rng.choice(list(widths))
            msgs.append(rand_row_msg(rng, relid, rng.choice(ROW_FORMS), widths[relid]))
            if poison is not None and xid == 1000 + transactions // 2 and k == size // 2:
                msgs.append(poison)
        msgs.append(b"C" + struct.pack("!BQQq", 0, final, final + 8, 9))
    return [(0x10000000 + i, m) for i, m in enumerate(msgs)]


class CountingNative:
    """router.stream.transactions' NATIVE, counting the rows feed_rows takes and the short
    transactions take_short takes."""

    def __init__(self):
        self.rows = 0
        self.short = 0

    def __getattr__(self, name):
        return getattr(NATIVE, name)

    def feed_rows(self, *args):
        out = NATIVE.feed_rows(*args)
        self.rows += out[2]
        return out

    def take_short(self, *args):
        events = args[4]
        before = len(events)
        out = NATIVE.take_short(*args)
        self.short += len(events) - before
        return out


def assemble(rows, version, python_path, memory_limit, cuts, spill_dir, part_changes=None):
    """Events (changes read back) and the assembler's memory state after every batch; the
    error of a batch that raised ends the run. Transactions whole unless ``part_changes``."""
    a = TransactionAssembler(RelationCache(), memory_limit=memory_limit, spill_dir=spill_dir,
                             part_changes=part_changes)
    decoder = Decoder(version)
    decode = (lambda data: decoder.decode(data)) if python_path else decoder.decode
    events, trace = [], []
    for start, stop in zip(cuts, cuts[1:]):
        try:
            events += a.feed_batch(rows[start:stop], decode)
        except DecodeError as exc:
            trace.append((type(exc), str(exc), exc.offset))
            break
        buf = a._current
        trace.append((a.memory, a.spill_count, buf and (buf.memory, buf.count, len(buf.changes))))
    summary = [(e.xid, e.final_lsn, e.commit_lsn, e.end_lsn, e.commit_time, e.origin_name,
                e.origin_lsn, e.gid, e.change_count, e.changes.spilled, list(e.changes),
                e.first_seq, e.partial)
               if isinstance(e, Transaction) else e for e in events]
    return summary, trace


def check_feed_batch(monkeypatch, tmp_path, rows, version, memory_limit, cuts,
                     part_changes=None):
    runs = []
    for python_path in (True, False):
        counting = CountingNative()
        monkeypatch.setattr("router.stream.transactions.NATIVE", counting)
        monkeypatch.setattr("router.stream.short_transactions.NATIVE", counting)
        runs.append(assemble(rows, version, python_path, memory_limit, cuts, str(tmp_path),
                             part_changes))
        assert (counting.rows == 0) is python_path, "the path under test was not taken"
        shorts = counting.short
    assert runs[0] == runs[1]
    return runs[0], shorts


@native
@pytest.mark.parametrize("memory_limit", [64 << 20, 4096, 300])
@pytest.mark.parametrize("name", CAPTURES)
def test_feed_batch_native_equals_python_on_golden(monkeypatch, tmp_path, name, memory_limit):
    rows = GOLDEN_ROWS[name]
    (events, trace), _ = check_feed_batch(monkeypatch, tmp_path, rows, CAPTURES[name],
                                          memory_limit, [*range(0, len(rows), 37), len(rows)])
    assert events and (memory_limit > 4096 or trace[-1][1] > 0)


@native
@pytest.mark.parametrize("memory_limit", [64 << 20, 20_000, 500, 0])
def test_feed_batch_native_equals_python_on_generated_streams(monkeypatch, tmp_path, memory_limit):
    rng = random.Random(memory_limit)
    rows = gen_stream(rng, 120)
    cuts = sorted({0, len(rows), *rng.sample(range(len(rows)), 60)})
    (events, trace), shorts = check_feed_batch(monkeypatch, tmp_path, rows, 1, memory_limit,
                                               cuts)
    assert len(events) == 120
    # short transactions were taken whole in C, unless the memory limit leaves no room
    assert (shorts > 20) is (memory_limit > 500), shorts
    spilled_open = [t for t in trace if t[2] and t[2][1] > t[2][2]]  # open, partly on disk
    assert (trace[-1][1] > 0 and spilled_open) if memory_limit < 64 << 20 else trace[-1][1] == 0


NEW = (b"N", ("1", "2", "3"))
POISON = {
    "unknown relation": (row_msg(b"I", 999, NEW), ProtocolViolation),
    "truncated insert": (row_msg(b"I", 16384, NEW)[:-1], TruncatedMessage),
    "trailing bytes": (row_msg(b"U", 16384, (b"K", ("1", None, None)), NEW) + b"x", TrailingBytes),
    "delete without K/O": (row_msg(b"D", 16384, NEW), DecodeError),
    "invalid UTF-8": (row_msg(b"I", 16384, NEW).replace(b"3", b"\xff"), DecodeError),
    "unknown kind": (row_msg(b"I", 16384, (b"N", ("1", "2", None))).replace(b"n", b"z"),
                     DecodeError),
}


@native
@pytest.mark.parametrize("poison, error", POISON.values(), ids=POISON)
@pytest.mark.parametrize("memory_limit", [64 << 20, 200])
def test_feed_batch_native_and_python_raise_alike(monkeypatch, tmp_path, poison, error,
                                                  memory_limit):
    rng = random.Random(5)
    rows = gen_stream(rng, 15, poison)
    cuts = sorted({0, len(rows), *rng.sample(range(len(rows)), 8)})
    (_, trace), _ = check_feed_batch(monkeypatch, tmp_path, rows, 1, memory_limit, cuts)
    assert trace[-1][0] is error
