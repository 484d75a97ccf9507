"""Every fast lane of ``router._native`` against its Python reference, driven by the one list
of them, ``router.native.TWINS``: one parametrised differential test runs both sides of each
pair on the same golden and generated inputs and compares what they return and what they do
(bytes, values, the lists they append to, the calls they make).

Rules:

* The Python reference is the truth. Where the native side declines (returns None or stops
  early) the lane checks that it may decline there and that what it did take equals what
  the reference computes for as much; the caller's fallback then gives the reference's
  outcome. A golden case names the verdict it must get ("same" or "declined").
* Inputs are built as pgrouter builds them: pgoutput bytes, Relations, Changes, encoders and
  the recorders a ``ChangeRouter`` binds, and at the I/O boundary the fakes of psycopg2 and
  confluent-kafka (``tests/native_io_fakes.py``); the builders of ``test_native.py`` and
  ``test_native_records.py`` are reused.
* Each twin runs its golden cases and ``GENERATED`` cases from a fixed seed; most of those
  the native side computes itself.
* The differential test skips when the accelerator is off; the table is checked anyway.
"""

from __future__ import annotations

import collections
import functools
import pathlib
import importlib
import random
import struct
from types import SimpleNamespace
from typing import Callable, NamedTuple

import msgspec
import pytest

from router.formats import envelope
from router.stream.changes import CHANGE_OVERHEAD, VALUE_OVERHEAD, Change, Changes
from router.formats.envelope import TableEncoder, TxContext
from router.errors import DecodeError
from router.native import IO_TWINS, NATIVE, TWINS
from router.pgoutput import UNCHANGED_TOAST as U
from router.pgoutput import Decoder, Delete, Insert, Relation, RelationColumn, Update
from router.pgoutput.reader import MAX_COLUMNS
from router.routing.plans import KINDS
from router.stream.relations import RelationCache
from router.routing.change_router import ChangeRouter, RouteSpec
from router.stream.short_transactions import MAX_ROWS
from router.stream.transactions import Transaction, TransactionAssembler
from test_avro_native import check_avro, gen_avro, golden_avro
from test_native import (
    BAD_UTF8, POISON, ROW_FORMS, gen_stream, golden_messages, golden_tuples, mutate, outcome,
    prefixes, rand_row_msg, rand_tuple, relation_msg, row_msg, tuple_data,
)
from test_native_records import (
    ERROR, ERROR2, KIND, POOLS, TALLY_STEPS, rand_relation, rand_row, rand_tx, tally_run,
)
from snapshot_twins import check_copy_records, gen_copy_records, golden_copy_records
from outbox_twins import check_outbox_recorder, gen_outbox_recorder, golden_outbox_recorder
from verify_twins import (
    check_verify_copy, check_verify_fold, check_verify_sums, gen_verify_copy, gen_verify_fold,
    gen_verify_sums, golden_verify_copy, golden_verify_fold, golden_verify_sums,
)
from tests.native_io_fakes import (
    Msg, drain_case, drain_run, hand_over_case, hand_over_run, rand_records,
)

SEED = 2024
GENERATED = 300
SAME, DECLINED = "same", "declined"


def resolve(path: str):
    """``module:attr.attr`` to the object it names."""
    module, _, attrs = path.partition(":")
    found = importlib.import_module(module)
    for attr in attrs.split("."):
        found = getattr(found, attr)
    return found


class Lane(NamedTuple):
    """How one twin is compared: ``check(python, native, case)`` runs both sides and returns
    the verdict; ``golden()`` gives (verdict, case) pairs, ``generate(rng)`` one case."""

    check: Callable
    golden: Callable
    generate: Callable
    declines: bool


# --- pgoutput: read_tuple, decode_row ------------------------------------------------------


def check_read_tuple(python, fast, case):
    data, pos = case
    got, want = fast(data, pos), outcome(python, data, pos)
    if got is None:
        assert want[0] == "raised" and issubclass(want[1], DecodeError), want
        return DECLINED
    assert want == ("ok", got)
    assert [type(v) for v in got[0]] == [type(v) for v in want[1][0]]
    return SAME


def golden_read_tuple():
    plain = tuple_data(("1", None, U, b"\x00\xff", "ünï 😀\n\"\\", ""))
    cases = [(SAME, (plain, 0)), (SAME, (b"xx" + plain, 2)), (SAME, (tuple_data(()), 0)),
             (SAME, (struct.pack("!H", MAX_COLUMNS) + b"n" * MAX_COLUMNS, 0)),
             (DECLINED, (struct.pack("!H", MAX_COLUMNS + 1) + b"n" * (MAX_COLUMNS + 1), 0)),
             (DECLINED, (plain[:-1], 0)), (DECLINED, (b"\x00\x01z", 0)), (DECLINED, (b"\x00", 5))]
    cases += [(DECLINED, (b"\x00\x01t" + struct.pack("!I", len(raw)) + raw, 0))
              for raw in BAD_UTF8]
    return cases + [(SAME, case) for case in golden_tuples()[::50]]


def gen_read_tuple(rng):
    pos = rng.choice([0, 1, 6])
    data = rng.randbytes(pos) + tuple_data(rand_tuple(rng))
    if rng.random() < 0.2:
        data = rng.choice([mutate(rng, data, pos), *prefixes(rng, data, pos, 3)])
    return data, pos


ROWS = (Insert, Update, Delete)


def check_decode_row(python, fast, data):
    got, want = fast(data), outcome(lambda d: python(Decoder(4), d), data)
    if got is None:
        assert want[0] == "raised" or type(want[1]) not in ROWS, want
        return DECLINED
    assert want == ("ok", got) and type(got) is type(want[1])
    return SAME


def golden_decode_row():
    new = (b"N", ("1", None, "x"))
    cases = [row_msg(b"I", 16384, new), row_msg(b"I", 0, (b"N", ())),
             row_msg(b"U", 1, (b"K", ("1", None, None)), (b"N", ("1", U, b"\x01"))),
             row_msg(b"U", 2**31, (b"O", ("1", "a", "b")), new), row_msg(b"U", 5, new),
             row_msg(b"D", 2**32 - 1, (b"K", ("7",))), row_msg(b"D", 9, (b"O", ("7", "ü")))]
    golden = [(SAME, data) for data in cases]
    message = b"M" + struct.pack("!BQ", 1, 8) + b"p\0" + bytes(4)
    golden += [(DECLINED, data) for data in [
        b"B" + bytes(20), relation_msg(16384, 3), message, b"", b"I", cases[0][:-1],
        cases[0] + b"x", row_msg(b"D", 1, new), POISON["invalid UTF-8"][0]]]
    captured = [data for data, _, _, in_stream in golden_messages() if not in_stream]
    return golden + [(SAME if type(Decoder(4).decode(d)) in ROWS else DECLINED, d)
                     for d in captured]


def gen_decode_row(rng):
    data = rand_row_msg(rng, rng.choice([0, 1, 16384, 2**32 - 1]), rng.choice(ROW_FORMS))
    return mutate(rng, data, 0) if rng.random() < 0.2 else data


# --- the transaction assembler: feed_rows, take_short ---------------------------------------

DECODER = Decoder(1)
RELATIONS = RelationCache()
for _relid, _width in ((16384, 3), (16385, 12)):
    RELATIONS.apply(DECODER.decode(relation_msg(_relid, _width)))


def feed_rows_py(feed_row, messages, i, budget):
    """``feed_row`` over a run as ``feed_batch`` takes it: (next, bytes, count) after every
    row taken, the changes, and the error that ended the run or None."""
    buf, assembler = SimpleNamespace(changes=[]), TransactionAssembler(RELATIONS)
    states, used, count, error = [(i, 0, 0)], 0, 0, None
    try:
        while i < len(messages) and used <= budget:
            j, size, n = feed_row(buf, messages, i, DECODER.decode, assembler)
            if j == i:
                break
            i, used, count = j, used + size, count + n
            states.append((i, used, count))
    except DecodeError as exc:
        error = (type(exc), str(exc))
    return states, buf.changes, error


def native_feed_rows(fast, messages, i, budget):
    changes = []
    got = fast(messages, i, changes, RELATIONS.by_id, Change, CHANGE_OVERHEAD, VALUE_OVERHEAD,
               budget)
    return got, changes


def check_feed_rows(python, fast, case):
    messages, start, budget = case
    got, changes = native_feed_rows(fast, messages, start, budget)
    states, want_changes, error = feed_rows_py(python, messages, start, budget)
    assert got in states and changes == want_changes[:got[2]], (got, states[-1], error)
    if got == states[-1] and error is None:
        return SAME
    assert native_feed_rows(fast, messages[got[0]:got[0] + 1], 0, 2**62)[0][2] == 0
    return DECLINED


def rows(*values, relid=16384):
    return [(0x100 + k, row_msg(b"I", relid, (b"N", v))) for k, v in enumerate(values)]


COMMIT = (0x900, b"C" + struct.pack("!BQQq", 0, 0x800, 0x908, 9))


def golden_feed_rows():
    plain = rows(("1", "a", None), ("2", U, b"\xff"), ("3", "\t", "😀"))
    upd = [(7, row_msg(b"U", 16385, (b"K", ("1",) + (None,) * 11), (b"N", ("x",) * 12))),
           (8, row_msg(b"D", 16384, (b"O", ("1", "2", "3"))))]
    cases = [(SAME, (plain + upd + [COMMIT], 0, 2**62)), (SAME, (plain, 0, 0)),
             (SAME, (plain, 1, 250)), (SAME, (plain, 3, 2**62)),
             (SAME, ([COMMIT] + plain, 0, 2**62)), (SAME, ([], 0, 2**62))]
    cases += [(DECLINED, (plain + [(9, poison)] + plain, 0, 2**62))
              for poison, _ in POISON.values()]
    return cases


def gen_feed_rows(rng):
    poison = rng.choice([p for p, _ in POISON.values()]) if rng.random() < 0.2 else None
    messages = gen_stream(rng, rng.randint(1, 4), poison)
    start = rng.randrange(len(messages))
    return messages, start, rng.choice([0, 200, 2_000, 20_000, 2**62])


def summary(events) -> list:
    return [(e.xid, e.final_lsn, e.commit_lsn, e.end_lsn, e.commit_time, e.origin_name,
             e.origin_lsn, e.gid, e.change_count, e.streamed, e.prepared, e.changes.spilled,
             len(e.changes), list(e.changes)) for e in events]


def take_short_py(take_short, messages, i, budget):
    events = []
    got = outcome(take_short, messages, i, RELATIONS.by_id, budget, events, Transaction,
                  DECODER.decode)
    return got, summary(events)


def check_take_short(python, fast, case):
    messages, start, budget = case
    events = []
    got = fast(messages, start, RELATIONS.by_id, budget, events, Transaction, Changes, Change,
               CHANGE_OVERHEAD, VALUE_OVERHEAD, MAX_ROWS)
    want = take_short_py(python, messages, start, budget)
    if (("ok", got), summary(events)) == want:
        return SAME
    rest, rest_events = take_short_py(python, messages, got, budget)
    assert (rest, summary(events) + rest_events) == want
    return DECLINED


def short_tx(xid, *row_messages, commit_lsn=None):
    final = 0x1000 * xid
    commit = final if commit_lsn is None else commit_lsn
    return [(final, b"B" + struct.pack("!QqI", final, 5, xid)), *row_messages,
            (final + 1, b"C" + struct.pack("!BQQq", 0, commit, final + 8, 6))]


def golden_take_short():
    one = rows(("1", "a", None))
    two = rows(("1", U, b"\x00"), ("2", "é", "\\"), relid=16385)
    poison = [(9, p) for p, _ in POISON.values()]
    long = rows(*[(str(k), "x", None) for k in range(MAX_ROWS + 1)])
    relation = (5, relation_msg(16384, 3))
    same = [short_tx(1, *one) + short_tx(2, *two) + short_tx(3),
            short_tx(1, *one) + [relation] + short_tx(2, *one), short_tx(1, *one, relation),
            short_tx(1, *one, commit_lsn=1), short_tx(1, *long), short_tx(1, *long[:MAX_ROWS]),
            short_tx(1, *one)[:-1], short_tx(1, *one) + short_tx(2, poison[0])]
    cases = [(SAME, (messages, 0, 2**62)) for messages in same]
    cases += [(SAME, (short_tx(1, *one), 0, 0)), (SAME, (short_tx(1, *one), 1, 2**62))]
    cases += [(DECLINED, (short_tx(1, *one) + short_tx(2, *one, p), 0, 2**62))
              for p in poison[1:]]
    return cases


def gen_take_short(rng):
    poison = rng.choice([p for p, _ in POISON.values()]) if rng.random() < 0.1 else None
    messages = gen_stream(rng, rng.randint(1, 8), poison)
    begins = [k for k, (_, data) in enumerate(messages) if data[:1] == b"B"]
    start = rng.choice(begins) if rng.random() < 0.9 else rng.randrange(len(messages))
    return messages, start, rng.choice([0, 2_000, 50_000, 2**62, 2**62])


# --- the router side: RowCodec, tx_bits, Recorder, record_run ------------------------------

INT8, FLOAT8, BOOL, TEXT = 20, 701, 16, 25
REL_A = Relation(16384, "public", "a", "d", (
    RelationColumn(1, "id", INT8, -1), RelationColumn(0, "f", FLOAT8, -1),
    RelationColumn(0, "b", BOOL, -1), RelationColumn(0, "t", TEXT, -1)))
REL_B = Relation(16385, "s%", 'b"', "f", (RelationColumn(1, "k", TEXT, -1),))
TX = TxContext(xid=7, commit_lsn=0x1000, end_lsn=0x1008, commit_time=0)
TX_ORIGIN = TxContext(xid=8, commit_lsn=0x2000, end_lsn=0x2008, commit_time=1, origin="o%",
                      origin_lsn=5)
LSN_HEADER = ("pgrouter.commit_lsn", b"4096")
PLAIN_ROW, ODD_ROW = ("1", "1.5", "t", "ünï\n"), ("1", "1_0", "x", U)


class Pools:
    """Encoders of random layouts and routers, made once (they need the accelerator)."""

    def __init__(self):
        rng = random.Random(SEED)
        self.layouts = [rand_relation(rng, 20000 + k) for k in range(12)]
        self.encoders = [TableEncoder(rel, route=rng.choice(["r", 'r"%']), db="d",
                                      column_indexes=None if rng.random() < 0.6 else
                                      tuple(sorted(rng.sample(range(len(rel.columns)), 1))))
                         for rel in self.layouts]
        self.routers = [(make_router(False), False), (make_router(True), False),
                        (make_router(False), True)]


@functools.cache
def pools() -> Pools:
    return Pools()


def check_row_codec(python, fast, case):
    enc, op, tx, lsn, seq, old, old_is_key, new = case
    assert type(enc._codec) is fast
    want = outcome(python, enc, op, tx, lsn, seq, old, old_is_key, new)
    got = enc._codec.change(envelope._OPS[op], enc._head, enc._mid, enc._tail, lsn, seq, old,
                            old_is_key, new)
    if got is None:
        return DECLINED
    assert ("ok", got) == want
    return SAME


def golden_row_codec():
    enc = TableEncoder(REL_A, route="r", db="d")
    same = [("c", TX, 1, 0, None, False, PLAIN_ROW), ("u", TX, 2**64 - 1, 9, PLAIN_ROW, False,
            PLAIN_ROW), ("d", TX, 3, 1, ("1", None, None, None), True, None),
            ("r", TX_ORIGIN, 4, 2, None, False, (None,) * 4),
            ("c", TX, 5, 3, None, False, ("-9223372036854775808", "NaN", "f", ""))]
    declined = [("c", TX, 1, 0, None, False, ODD_ROW), ("u", TX, 2, 1, PLAIN_ROW, False, ODD_ROW),
                ("c", TX, 3, 2, None, False, ("1", "1.5", "t", b"\x00")),
                ("c", TX, 4, 3, None, False, ("1", "1.5", "t", "\ud800"))]
    return ([(SAME, (enc, *c)) for c in same] + [(DECLINED, (enc, *c)) for c in declined])


def rand_change_args(rng, rel):
    op = rng.choice("cudr")
    old = None if op in "cr" or rng.random() < 0.2 else rand_row(rng, rel, rng.random() < 0.5)
    new = None if op == "d" else rand_row(rng, rel)
    lsn = rng.choice([0, 2**64 - 1, rng.randint(0, 2**64 - 1)])
    return op, lsn, rng.randint(0, 2**40), old, old is not None and rng.random() < 0.5, new


def gen_row_codec(rng):
    enc = rng.choice(pools().encoders)
    op, lsn, seq, old, old_is_key, new = rand_change_args(rng, enc.relation)
    return enc, op, rand_tx(rng), lsn, seq, old, old_is_key, new


class NoTxBits:
    """``router.formats.envelope``'s NATIVE with ``tx_bits`` declining: ``_use_tx`` in Python."""

    def __getattr__(self, name):
        return getattr(NATIVE, name)

    @staticmethod
    def tx_bits(*args):
        return None


def check_tx_bits(python, fast, case):
    enc, tx = case
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(envelope, "NATIVE", NoTxBits())
        enc._tx = None
        python(enc, tx)
    got = fast(tx.commit_lsn, tx.xid, tx.commit_time, tx.origin, tx.origin_lsn, enc._route_part)
    if got is None:
        iso = tx.commit_time_iso
        assert tx.origin is not None or len(iso) != 32 or iso[0] == "-", iso
        return DECLINED
    assert got == (enc._mid, enc._tail)
    return SAME


DAY = 86_400_000_000


def golden_tx_bits():
    enc = TableEncoder(REL_B, route='r"%', db="d")
    same = [0, -1, 1, 999_999, 1_000_000, -1_000_000, -946_684_800_000_000,  # 1970
            -730_119 * DAY, -730_119 * DAY + 1, 2_921_940 * DAY - 1, 59 * DAY, 60 * DAY,
            1_520 * DAY]  # year 1 and 9999 bounds, 2000-02-29, 2004-02-29
    cases = [(SAME, (enc, TxContext(xid=1, commit_lsn=2, end_lsn=3, commit_time=t)))
             for t in same]
    cases += [(DECLINED, (enc, TxContext(xid=1, commit_lsn=2, end_lsn=3, commit_time=t)))
              for t in (-730_119 * DAY - 1, 2_921_940 * DAY, -2**63, 2**63 - 1)]
    return cases + [(DECLINED, (enc, TX_ORIGIN))]


def gen_tx_bits(rng):
    tx = rand_tx(rng)
    if rng.random() < 0.8:
        tx = TxContext(xid=tx.xid, commit_lsn=tx.commit_lsn, end_lsn=0,
                       commit_time=rng.randint(-730_000 * DAY, 2_900_000 * DAY),
                       origin_lsn=tx.origin_lsn)
    return rng.choice(pools().encoders), tx


def check_recorder(python, fast, case):
    enc, tx, topic, lsn_header, seq_name, args = case
    record = enc.recorder(tx, topic, lsn_header, seq_name)
    reference = python(enc._encode_py, topic, seq_name)
    reference.tx, reference.lsn_header = tx, lsn_header
    assert type(record) is fast and type(reference) is not fast
    assert outcome(record, *args) == outcome(reference, *args)
    return SAME


def golden_recorder():
    enc = TableEncoder(REL_A, route="r", db="d")
    rows = [("c", 1, 0, None, False, PLAIN_ROW), ("u", 2, 1, PLAIN_ROW, False, ODD_ROW),
            ("d", 3, 2, ("1", None, None, None), True, None), ("c", 4, 3, None, False, ("1",))]
    return [(SAME, (enc, tx, topic, header, "pgrouter.seq", row)) for row in rows
            for tx, topic, header in [(TX, "t", None), (TX_ORIGIN, "t", LSN_HEADER),
                                      (TX, "tópico%", LSN_HEADER)]]


def gen_recorder(rng):
    enc = rng.choice(pools().encoders)
    tx = rand_tx(rng)
    header = rng.choice([None, ("pgrouter.commit_lsn", b"%d" % tx.commit_lsn)])
    return (enc, tx, rng.choice(["t", "tópico%"]), header, rng.choice(["pgrouter.seq", "s"]),
            rand_change_args(rng, enc.relation))


def make_router(filtered: bool) -> ChangeRouter:
    """Routes as a config makes them: all actions, some, a column list, and (``filtered``)
    an UPDATE filter, which makes the router evaluate updates one by one."""
    routes = [RouteSpec(name="all", all_tables=True),
              RouteSpec(name="ins_del", all_tables=True,
                        operations=frozenset({"insert", "delete", "truncate"})),
              RouteSpec(name="cols", planner=lambda rel: {"columns": (0,)})]
    if filtered:
        routes.append(RouteSpec(name="f", planner=lambda rel: {
            "update_filter": lambda row: True, "filter_columns": (0,)}))
    return ChangeRouter(routes, db="d", position_headers=True)


def bound_ops(router_python, rel, tx, lsn_header, ops) -> dict:
    """{op: recorders} as ``ChangeRouter.route`` binds them for ``rel`` (None: a route
    filters), for the ``ops`` bound so far; Python recorders when ``router_python[1]``."""
    chosen, python = router_python
    with pytest.MonkeyPatch.context() as mp:
        if python:
            mp.setattr(envelope, "NATIVE", None)
        return {op: chosen._recorders(rel, op, tx, lsn_header, []) for op in ops}


class Failing:
    """A recorder whose record of change ``seq`` raises."""

    def __init__(self, seq):
        self.seq = seq

    def __call__(self, kind, lsn, seq, old, old_is_key, new):
        if seq == self.seq:
            raise ValueError(f"record {seq} failed")
        return ("failing", kind, lsn, seq)


def record_run_outcome(fn, case):
    changes, i, rel, ops, seq, records, limit = case
    records = list(records)
    return outcome(fn, changes, i, rel, ops, KINDS, seq, records, limit), records


def check_record_run(python, fast, case):
    got = record_run_outcome(fast, case)
    assert got == record_run_outcome(python, case)
    _, i, _, _, seq, records, _ = case
    if got[0][0] == "ok":
        (taken_to, seq_to), now = got[0][1], got[1]
        assert taken_to - i == seq_to - seq and now[:len(records)] == records
    return SAME


def change(rel, op, lsn, row):
    if op == "insert":
        return Change(op, lsn, rel, None, False, row)
    return Change(op, lsn, rel, row[:1] + (None,) * (len(row) - 1), True,
                  row if op == "update" else None)


def golden_record_run():
    plain, filtering, python = pools().routers
    ops = bound_ops(plain, REL_A, TX, LSN_HEADER, KINDS)
    py_ops = bound_ops(python, REL_A, TX, None, KINDS)
    filtered = bound_ops(filtering, REL_A, TX, None, KINDS)
    assert [len(ops[op]) for op in KINDS] == [3, 2, 3] and filtered["update"] is None
    run = [change(REL_A, op, 10 + k, (str(k), "1.5", "t", "x"))
           for k, op in enumerate(["insert", "insert", "delete", "update", "insert"])]
    copy = msgspec.structs.replace(REL_A)
    other = [change(REL_B, "insert", 20, ("k",)), Change("truncate", 21, relations=(REL_A,)),
             change(copy, "insert", 22, PLAIN_ROW)]
    mixed = {op: ops[op] + py_ops[op] for op in KINDS}
    failing = {op: ops[op] + (Failing(3),) for op in KINDS}
    cases = [(run, 0, REL_A, ops, 0, [], 2000), (run, 0, REL_A, py_ops, 5, [], 2000),
             (run, 2, REL_A, mixed, 2**40, [], 2000), (run, 5, REL_A, ops, 0, [], 2000),
             (run, 0, REL_A, ops, 0, [], 3), (run, 0, REL_A, ops, 0, [("p",)] * 3, 3),
             (run, 0, REL_A, filtered, 0, [], 2000), (run, 0, REL_A, failing, 1, [], 2000),
             (run[:2], 0, REL_A, {"insert": ops["insert"]}, 0, [], 2000),
             (run, 0, REL_A, {"insert": (), "delete": ops["delete"]}, 7, [], 2000)]
    cases += [(run[:2] + [c] + run, 0, REL_A, ops, 0, [], 2000) for c in other]
    return [(SAME, case) for case in cases]


def source_row(rng, rel: Relation) -> tuple:
    """A row as PostgreSQL sends it: values its types print, NULLs, unchanged TOAST and (in
    binary mode) bytes."""
    def value(oid):
        r = rng.random()
        return (None if r < 0.1 else U if r < 0.15 else rng.randbytes(3) if r < 0.2 else
                rng.choice(POOLS[KIND.get(oid, "text")][0]))
    return tuple(value(c.type_oid) for c in rel.columns)


def gen_record_run(rng):
    rel, other = rng.sample(pools().layouts, 2)
    tx = rand_tx(rng)
    lsn_header = rng.choice([None, ("pgrouter.commit_lsn", b"%d" % tx.commit_lsn)])
    ops = bound_ops(rng.choice(pools().routers), rel, tx, lsn_header,
                    [op for op in KINDS if rng.random() < 0.85])
    seq = rng.randint(0, 2**40)
    changes = []
    for k in range(rng.randint(0, 30)):
        which = rng.random()
        target = rel if which < 0.9 else other
        if which > 0.97:
            changes.append(Change("message", k, message=None))
            continue
        op = rng.choice(list(KINDS))
        old = None if op == "insert" or rng.random() < 0.3 else source_row(rng, target)
        changes.append(Change(op, k, target, old, old is not None and rng.random() < 0.5,
                              None if op == "delete" else source_row(rng, target)))
    if rng.random() < 0.15:
        failing = (Failing(seq + rng.randint(0, 4)),)
        ops = {op: recorders and recorders + failing for op, recorders in ops.items()}
    limit = rng.choice([1, 3, 10, 2000])
    records = [("p",)] * rng.choice([0, 0, 1, limit])
    return changes, rng.randint(0, len(changes)), rel, ops, seq, records, limit


# --- delivery: Tally, drain, hand_over -----------------------------------------------------


def check_tally(python, fast, case):
    count, steps = case
    assert outcome(tally_run, fast, count, steps) == outcome(tally_run, python, count, steps)
    return SAME


def golden_tally():
    cases = [(2, ["ack", "call ok"]), (2, ["ack", "fail", "ack"]), (0, []), (0, ["ack"]),
             (1, ["call error"]), (-1, []),
             (4, ["call error, small record", "call error, large record", "call ok",
                  "call error, small record"]),
             (2, ["call error, small record", "fail", "call ok"])]
    return [(SAME, case) for case in cases]


def gen_tally(rng):
    count = rng.choice([0, 1, 2, 3, 5, 40])
    return count, rng.choices(list(TALLY_STEPS), weights=[8, 2, 1, 4, 1, 1, 1, 1],
                              k=rng.randint(0, count + 3))


def check_drain(python, fast, case):
    assert drain_run(fast, *case) == drain_run(python, *case)
    return SAME


def golden_drain():
    ten = [Msg(b"x" * 10, i) for i in range(10)]
    cases = [(ten, 3, 10**9), (ten, 100, 25), (ten, 0, 10**9), (ten, 100, 0), (ten, 100, 10**9),
             ([], 5, 5), ([Msg(b"a", 1), object()], 10, 100),
             ([Msg(5, 1), Msg(b"ab", 2)], 10, 100), (ten, 100, 10**9, 4, ERROR)]
    return [(SAME, case) for case in cases]


def check_hand_over(python, fast, case):
    records, start, kw = case
    want = hand_over_run(python, records, start, **kw)
    assert hand_over_run(fast, records, start, **kw) == want
    return SAME


def golden_hand_over():
    records = rand_records(random.Random(SEED), 6)
    cases = [(records, 0, {}), (records, 6, {}), (records, 9, {}), (records, -1, {}),
             ([], 0, {}), (records, 2, {"full_at": [1]}), (records, 0, {"full_at": [4, 5]}),
             (records, 0, {"fail_at": 2, "error": ERROR2})]
    return [(SAME, case) for case in cases]


def check_verify_row(python, fast, case):
    got = fast(*case)
    if got is None:
        assert any(type(v) not in (str, int, float, bool, type(None))
                   for v in case[0] + case[2]), case
        return DECLINED
    assert got == python(*case), case
    return SAME


_HEAD = b'["a","b","c"]'
_TEXTS = ["", "x", "é€😀", '"\\/', "\x00\x01\x1f\x7f\b\f\n\r\t", "y" * 70, "z" * 200]


def golden_verify_row():
    same = [((1,), _HEAD, ("x", None, ""), 7), ((None,), b"[]", (), 1),
            ((2, "x,1"), _HEAD, (True, False, -5), 3), ((2**70,), _HEAD, (2**70, -2**63, 0), 9),
            ((0.5, True), _HEAD, (0.1, -0.0, 1e300), 65536),
            (("k" * 60,), _HEAD, tuple(_TEXTS[2:5]), 5),
            (("é" * 130, None), b'["' + b"n" * 100 + b'"]', ("y" * 1000,), 11)]
    declined = [((1,), _HEAD, ([1], 1, None), 7), ((1,), _HEAD, ({"a": 1},), 7),
                (([1],), _HEAD, (1,), 7)]
    return [(SAME, c) for c in same] + [(DECLINED, c) for c in declined]


def gen_verify_row(rng):
    def value():
        kind = rng.random()
        if kind < 0.4:
            return rng.choice(_TEXTS) + "".join(chr(rng.randrange(1, 0x3000))
                                                for _ in range(rng.randrange(0, 90)))
        if kind < 0.6:
            return rng.randint(-2**80, 2**80) if rng.random() < 0.2 else rng.randint(-999, 999)
        if kind < 0.7:
            return rng.uniform(-1e9, 1e9)
        return rng.choice([None, True, False])

    key = tuple(value() for _ in range(rng.randrange(1, 4)))
    values = [value() for _ in range(rng.randrange(0, 9))]
    if rng.random() < 0.1:
        values.append(rng.choice([[1], {"a": "b"}]))
    return key, _HEAD, tuple(values), rng.randint(1, 65536)


def check_copy_rows(python, fast, case):
    got = fast(case)
    if got is None:
        assert b"\\" in case or any(b >= 0x80 for b in case), case
        return DECLINED
    assert got == python(case), case
    return SAME


_COPY = [b"", b"\n", b"a\tb\n", b"1\t\\N\tx\n", b"a\\tb\t\\\\\t\\n\\r\\b\\f\\v\\q\\x\n",
         b"tail\\", "\u00e9\u20ac\U0001f600\t\\N\n".encode(), b"no newline\tat end", b"\t\t\n\n"]


def golden_copy_rows():
    declined = [b"\\101\n", b"\\x41\n", b"\xff\n", "\\\u00e9\n".encode()]
    return [(SAME, c) for c in _COPY] + [(DECLINED, c) for c in declined]


def gen_copy_rows(rng):
    pieces = ["a", "é€", "\t", "\n", "\\N", "\\t", "\\\\", "\\n", "x" * 40, "", "7"]
    if rng.random() < 0.1:
        pieces.append(rng.choice(["\\12", "\\x4f"]))
    return "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 60))).encode()

LANES: dict[str, Lane] = {
    "read_tuple": Lane(check_read_tuple, golden_read_tuple, gen_read_tuple, True),
    "decode_row": Lane(check_decode_row, golden_decode_row, gen_decode_row, True),
    "feed_rows": Lane(check_feed_rows, golden_feed_rows, gen_feed_rows, True),
    "take_short": Lane(check_take_short, golden_take_short, gen_take_short, True),
    "row_codec": Lane(check_row_codec, golden_row_codec, gen_row_codec, True),
    "tx_bits": Lane(check_tx_bits, golden_tx_bits, gen_tx_bits, True),
    "recorder": Lane(check_recorder, golden_recorder, gen_recorder, False),
    "outbox_recorder": Lane(check_outbox_recorder, golden_outbox_recorder,
                            gen_outbox_recorder, True),
    "record_run": Lane(check_record_run, golden_record_run, gen_record_run, False),
    "tally": Lane(check_tally, golden_tally, gen_tally, False),
    "drain": Lane(check_drain, golden_drain, drain_case, False),
    "hand_over": Lane(check_hand_over, golden_hand_over, hand_over_case, False),
    "avro": Lane(check_avro, golden_avro, gen_avro, True),
    "verify_row": Lane(check_verify_row, golden_verify_row, gen_verify_row, True),
    "copy_rows": Lane(check_copy_rows, golden_copy_rows, gen_copy_rows, True),
    "verify_fold": Lane(check_verify_fold, golden_verify_fold, gen_verify_fold, False),
    "verify_copy": Lane(check_verify_copy, golden_verify_copy, gen_verify_copy, False),
    "verify_sums": Lane(check_verify_sums, golden_verify_sums, gen_verify_sums, True),
    "copy_records": Lane(check_copy_records, golden_copy_records, gen_copy_records, True),
}


def test_twins_list_every_native_lane_and_resolve():
    """TWINS names every public function and type of router._native but ``configure``, each
    once, and every entry resolves on both sides (the Python side also without the build)."""
    assert set(LANES) == set(TWINS)
    for path, _ in TWINS.values():
        assert callable(resolve(path)), path
    module = pytest.importorskip("router._native")
    public = {name for name in dir(module) if not name.startswith("_")
              and callable(getattr(module, name))} - {"configure"}
    natives = [attr for _, attr in TWINS.values()]
    assert sorted(natives) == sorted(public)


def test_every_c_file_of_actors_has_its_io_twin_entry():
    """Each C extension of ``actors/`` is in ``IO_TWINS``, its Python twin resolves, its
    comparing test exists and its gain names the bench command that measured it."""
    root = pathlib.Path(__file__).resolve().parents[2]
    c_files = {p.relative_to(root).with_suffix("").as_posix().replace("/", ".")
               for p in (root / "actors").rglob("*.c")}
    assert c_files == {name.partition(":")[0] for name in IO_TWINS}
    for twin, test, gain in IO_TWINS.values():
        assert callable(resolve(twin)), twin
        assert (root / test).is_file(), test
        assert "bench/" in gain, gain


@pytest.mark.parametrize("name", TWINS)
def test_native_twin_equals_its_python_reference(name):
    if NATIVE is None:
        pytest.skip("router._native off (PGROUTER_PURE_PYTHON=1)")
    path, attr = TWINS[name]
    python, fast = resolve(path), getattr(NATIVE, attr)
    lane = LANES[name]
    golden = lane.golden()
    assert [lane.check(python, fast, case) for _, case in golden] == [v for v, _ in golden]
    rng = random.Random(f"{SEED}:{name}")
    verdicts = collections.Counter(lane.check(python, fast, lane.generate(rng))
                                   for _ in range(GENERATED))
    assert verdicts[SAME] >= GENERATED * 2 // 3, verdicts
    assert (verdicts[DECLINED] > 0) is lane.declines, verdicts
