"""The sink side of ``router._native`` against its Python twins: ``RowCodec`` and ``Recorder``
through ``TableEncoder`` (``_encode_py`` and the ``recorder`` closure) give the same key, value
and headers for every operation, row shape, projection, key layout and value they are given,
including every value C must leave to Python (the comparison then checks that it does); the
delivery ``Tally`` makes the same ``on_done`` calls as ``PyTally``."""

from __future__ import annotations

import json
import random

import pytest

from router.formats import envelope
from router.delivery.tally import PyTally
from router.formats.envelope import TableEncoder, TxContext
from router.native import NATIVE
from router.pgoutput import UNCHANGED_TOAST as U
from router.pgoutput import Relation, RelationColumn
from test_envelope import ref_encode
from test_native import native, outcome

INT2, INT4, INT8, OID, FLOAT4, FLOAT8, BOOL = 21, 23, 20, 26, 700, 701, 16
TEXT, NUMERIC, TIMESTAMPTZ, JSONB, VARCHAR, BYTEA = 25, 1700, 1184, 3802, 1043, 17
OIDS = [INT2, INT4, INT8, OID, FLOAT4, FLOAT8, BOOL, TEXT, NUMERIC, TIMESTAMPTZ, JSONB, VARCHAR,
        BYTEA]

ESCAPED = [chr(c) for c in range(0x20)] + ['"', "\\"]  # what JSON escapes
TEXTS = ["", "plain", "".join(ESCAPED), *ESCAPED, "\x7f", "a\x7fb", "ünïcödé ✓",
         "emoji 😀 𝄞", "%d %s %%b", "null", "x" * 5000, ("".join(ESCAPED) + "é😀") * 200]
INTS = ["0", "1", "-1", "7", "32767", "2147483647", "-9223372036854775808",
        "18446744073709551615", "99999999999999999999", "-99999999999999999999"]
FLOATS = ["1", "1.5", "-2.25", "1e+20", "1e-07", "NaN", "Infinity", "-Infinity", "0", "-0",
          "1.7976931348623157e+308", "5e-324", "3.14159", "nan", "inf", "-inf", "infinity",
          "1_0", " 1.5 ", "1e400", "+1"]
#: (values the C code must encode itself, values it may leave to Python) per column kind
POOLS = {
    "int": (INTS, ["123456789012345678901", "007", "-0", "+1", " 1", "1 ", "1_0", "00", "٣",
                   "-", "", "x", "1.0"]),
    "float": (FLOATS + ["Infinity "], ["x", "", "1.5.", "\ud800"]),
    "bool": (["t", "f", "x", "true", "", "T"], ["\ud800"]),
    "text": (TEXTS, ["\ud800", "a\udfffb"]),
}
KIND = {INT2: "int", INT4: "int", INT8: "int", OID: "int", FLOAT4: "float", FLOAT8: "float",
        BOOL: "bool"}
NAMES = ["id", "v", "%s", 'q"uote', "ünï", "a b", "x\ny", "😀", "back\\slash", "t\x01"]
LSN_HEADER, SEQ_NAME = ("pgrouter.commit_lsn", b"123"), "pgrouter.seq"


def rand_value(rng, oid: int, odd: bool):
    r = rng.random()
    if r < 0.1:
        return None
    plain, weird = POOLS[KIND.get(oid, "text")]
    if not odd:
        return rng.choice(plain)
    if r < 0.35:
        return U
    if r < 0.55:
        return rng.choice([b"", b"\x00\xff", b"\\x"])
    return rng.choice(weird)


def rand_row(rng, rel: Relation, key_only: bool = False) -> tuple:
    """Half the rows plain (text and NULLs, C's case), the others with odd columns."""
    odd = rng.random() < 0.5
    return tuple(None if key_only and not c.flags & 1 else
                 rand_value(rng, c.type_oid, odd and rng.random() < 0.3) for c in rel.columns)


def rand_relation(rng, relid: int) -> Relation:
    n = rng.choice([1, 2, 3, 5, 8, 13, 13, 300])
    keys = rng.sample(range(n), min(n, rng.randint(0, 3)))
    cols = tuple(RelationColumn(int(i in keys), rng.choice(NAMES) + str(i), rng.choice(OIDS), -1)
                 for i in range(n))
    return Relation(relid, rng.choice(["public", "s%d", "ü"]), rng.choice(["t", 'T"1', "x%"]),
                    rng.choice("dfin"), cols)


def rand_tx(rng) -> TxContext:
    return TxContext(xid=rng.randint(1, 2**32 - 1),
                     commit_lsn=rng.choice([0, 2**64 - 1, rng.randint(0, 2**64 - 1)]), end_lsn=0,
                     commit_time=rng.randint(-10**15, 10**16),
                     origin=rng.choice([None, "node%s", 'q"o\\', "ünï%d", "%%", "😀"]),
                     origin_lsn=rng.choice([None, 5, 2**64 - 1]))


def python_encoder(rel: Relation, **kw) -> TableEncoder:
    """The encoder built as without the accelerator: its recorder is the Python closure."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(envelope, "NATIVE", None)
        return TableEncoder(rel, **kw)


class Checker:
    """One layout's native and Python encoders, compared change by change."""

    def __init__(self, rel: Relation, pick: list[int] | None, route="r", db="postgres"):
        kw = dict(route=route, db=db, column_indexes=None if pick is None else tuple(pick))
        self.rel, self.pick, self.route, self.db = rel, pick, route, db
        self.enc, self.py_enc = TableEncoder(rel, **kw), python_encoder(rel, **kw)
        assert self.enc._codec is not None and self.py_enc._codec is None
        self.native = self.fallback = self.ref_checked = 0

    def change(self, op, tx, lsn, seq, old, old_is_key, new):
        case = (op, tx, lsn, seq, old, old_is_key, new)
        want = outcome(self.enc._encode_py, *case)
        assert outcome(self.enc.encode_change, *case) == want, case
        enc = self.enc  # the codec itself, to count what C encodes and what it leaves
        direct = enc._codec.change(envelope._OPS.get(op) or envelope._encode(op), enc._head,
                                   enc._mid, enc._tail, lsn, seq, old, old_is_key, new)
        if direct is not None:
            assert ("ok", direct) == want, case
        self.native += direct is not None
        self.fallback += direct is None
        if want[0] == "ok":
            self.check_json(case, *want[1])
        return want

    def record(self, topic, lsn_header, op, tx, lsn, seq, old, old_is_key, new):
        rec = self.enc.recorder(tx, topic, lsn_header, SEQ_NAME)
        py_rec = self.py_enc.recorder(tx, topic, lsn_header, SEQ_NAME)
        assert type(rec) is NATIVE.Recorder and type(py_rec) is not NATIVE.Recorder
        args = (op, lsn, seq, old, old_is_key, new)
        got = outcome(rec, *args)
        assert got == outcome(py_rec, *args), args
        want = self.change(op, tx, lsn, seq, old, old_is_key, new)
        if want[0] == "ok":
            headers = None if lsn_header is None else [lsn_header, (SEQ_NAME, b"%d" % seq)]
            assert got[1] == (topic, *want[1], headers)

    def check_json(self, case, key, value):
        op, tx, lsn, seq, old, old_is_key, new = case
        json.loads(key)
        doc = json.loads(value)
        assert (doc["op"], doc["source"]["lsn"], doc["source"]["seq"]) == (op, lsn, seq)
        keyrow = new if new is not None else old
        cols = self.rel.columns
        if keyrow is not None and any(keyrow[i] is U for i, c in enumerate(cols) if c.flags & 1):
            return  # the key comes from the old key tuple: test_envelope checks that
        cols = list(range(len(cols))) if self.pick is None else self.pick
        assert ref_encode(self.rel, cols, self.route, self.db, *case) == (key, value)
        self.ref_checked += 1


def forms(rng, rel: Relation):
    """Every op with old None / key tuple / full row and new None / row."""
    for op in "cudr":
        for old_form in ("none", "key", "row"):
            for new in (None, rand_row(rng, rel)):
                old = None if old_form == "none" else rand_row(rng, rel, old_form == "key")
                lsn = rng.choice([0, 1, 2**32, 2**63, 2**64 - 1, rng.randint(0, 2**64 - 1)])
                seq = rng.choice([0, 1, 99, rng.randint(0, 2**40)])
                yield op, lsn, seq, old, old_form == "key", new


@native
def test_encode_change_and_recorder_equal_python_on_random_layouts():
    rng = random.Random(7)
    total = native_count = fallback = ref_checked = 0
    for relid in range(50):
        rel = rand_relation(rng, relid)
        n = len(rel.columns)
        pick = None if rng.random() < 0.5 else sorted(rng.sample(range(n), rng.randint(1, n)))
        route, db = rng.choice([("r", "postgres"), ("r%d", "db%s"), ('r"1', "ü")])
        checker = Checker(rel, pick, route, db)
        for _ in range(2):
            tx, topic = rand_tx(rng), rng.choice(["t", "tópico%"])
            lsn_header = rng.choice([None, ("pgrouter.commit_lsn", b"%d" % tx.commit_lsn)])
            for op, lsn, seq, old, old_is_key, new in forms(rng, rel):
                checker.record(topic, lsn_header, op, tx, lsn, seq, old, old_is_key, new)
                total += 1
        native_count += checker.native
        fallback += checker.fallback
        ref_checked += checker.ref_checked
    assert total == 50 * 2 * 24
    assert native_count > total // 4 and fallback > total // 10 and ref_checked > total // 2


@native
@pytest.mark.parametrize("kind", POOLS)
@pytest.mark.parametrize("key", [False, True], ids=["value", "key"])
def test_every_listed_value_of_every_kind(kind, key):
    """Each value alone in a column of its kind (and of a key column): equal outcomes, and
    C encodes every value of the plain pool itself."""
    oid = {"int": INT8, "float": FLOAT8, "bool": BOOL, "text": TEXT}[kind]
    rel = Relation(1, "public", "t", "d", (RelationColumn(int(key), "c", oid, -1),
                                           RelationColumn(0, "v", TEXT, -1)))
    checker = Checker(rel, None)
    tx = TxContext(xid=1, commit_lsn=2**64 - 1, end_lsn=0, commit_time=0, origin="o%")
    plain, weird = POOLS[kind]
    for value in plain + weird:
        for op, old, new in [("c", None, (value, "x")), ("u", (value, None), (value, "y")),
                             ("d", (value, "z"), None)]:
            checker.record("t", LSN_HEADER, op, tx, 2**64 - 1, 3, old, key and old is not None, new)
    assert checker.native == 3 * len(plain) and checker.fallback == 3 * len(weird)


@native
def test_wide_rows_outgrow_the_stack_buffer():
    rel = Relation(1, "public", "t", "f", tuple(RelationColumn(int(i < 2), f"c{i}", TEXT, -1)
                                                for i in range(300)))
    checker = Checker(rel, None)
    tx = TxContext(xid=1, commit_lsn=5, end_lsn=0, commit_time=0)
    row = tuple(("".join(ESCAPED) + "é😀") * 20 for _ in range(300))
    for old, new in [(None, row), (row, row), (row, None)]:
        checker.record("t", None, "u", tx, 7, 1, old, False, new)
    assert checker.native == 3


# --- Tally ---------------------------------------------------------------------------------

TALLY_STEPS = {
    "call ok": lambda t: t(None, "msg"), "call ok, no msg": lambda t: t(None),
    "call error": lambda t: t(ERROR, "msg"), "ack": lambda t: t.ack("metadata"),
    "ack, no args": lambda t: t.ack(), "fail": lambda t: t.fail(ERROR),
    "call error, small record": lambda t: t(ERROR, Msg(10)),
    "call error, large record": lambda t: t(ERROR2, Msg(5000)),
}
ERROR = RuntimeError("delivery failed")
ERROR2 = RuntimeError("record too large")


class Msg:
    """What a librdkafka delivery report's message offers the Tally: its length."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __eq__(self, other):
        return type(other) is Msg and other.size == self.size

    def __repr__(self):
        return f"Msg({self.size})"


def tally_run(cls, count: int, steps) -> list:
    calls = []
    tally = cls(count, lambda *args: calls.append(args), "ticket")
    trace = [tally.left]
    for step in steps:
        trace.append((outcome(TALLY_STEPS[step], tally), tally.left, list(calls)))
    return trace


@pytest.mark.parametrize("cls", [PyTally, pytest.param("native", marks=native)])
def test_tally_names_the_largest_failed_record_once_every_record_is_reported(cls):
    """librdkafka fails every record of a batch the broker refused as too large: the Tally
    waits for the batch's reports and names the largest record, not the first reported."""
    cls = NATIVE.Tally if cls == "native" else cls
    trace = tally_run(cls, 4, ["call error, small record", "call error, large record",
                               "call ok", "call error, small record"])
    assert [calls for _, _, calls in trace[1:]] == [[], [], [],
                                                    [("ticket", ERROR2, 0, Msg(5000))]]
    trace = tally_run(cls, 2, ["call error, small record", "fail", "call ok"])
    assert trace[-1][2] == [("ticket", ERROR, 0)], "a failure without its record fires at once"


@pytest.mark.parametrize("cls", [PyTally, pytest.param("native", marks=native)])
def test_tally_negative_count_and_failing_on_done(cls):
    cls = NATIVE.Tally if cls == "native" else cls
    with pytest.raises(ValueError, match="negative count"):
        cls(-1, print, "ticket")

    def on_done(*args):
        raise KeyError("boom")

    tally = cls(1, on_done, "ticket")
    with pytest.raises(KeyError):
        tally(None, "msg")
    assert tally(None, "msg") is None and tally.left == 0  # fired once, never again


@native
def test_encoders_with_recorders_are_freed():
    """A Recorder's fallback closes over the encoder that caches it: the cycle is only freed
    because Recorder takes part in garbage collection."""
    import gc
    rel = Relation(1, "public", "t", "d", (RelationColumn(1, "id", 20, -1),
                                           RelationColumn(0, "x", 25, -1)))
    tx = TxContext(xid=1, commit_lsn=2, end_lsn=3, commit_time=4)
    gc.collect()
    before = sum(type(o) is TableEncoder for o in gc.get_objects())
    for _ in range(50):
        enc = TableEncoder(rel, route="r", db="d")
        assert type(enc.recorder(tx, "t", None, "s")).__name__ == "Recorder"
    del enc
    gc.collect()
    assert sum(type(o) is TableEncoder for o in gc.get_objects()) == before


def test_recorder_is_bound_to_each_transaction_in_turn():
    """One recorder per topic serves every transaction: what it records carries the source
    fields of the transaction it was last asked for."""
    rel = Relation(5, "public", "t", "d", (RelationColumn(1, "id", 20, -1),))
    enc = TableEncoder(rel, route="r", db="d")
    seen = []
    for xid in (10, 11, 10, 12):
        tx = TxContext(xid=xid, commit_lsn=xid * 100, end_lsn=xid * 100 + 8,
                       commit_time=xid * 1_000_000)
        rec = enc.recorder(tx, "topic", ("pgrouter.commit_lsn", b"%d" % (xid * 100)), "s")
        topic, _, value, headers = rec("c", xid * 100 - 1, 0, None, False, ("1",))
        source = json.loads(value)["source"]
        seen.append((source["xid"], source["commit_lsn"], headers[0][1]))
        assert topic == "topic"
    assert seen == [(x, x * 100, b"%d" % (x * 100)) for x in (10, 11, 10, 12)]
