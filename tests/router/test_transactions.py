"""TransactionAssembler: normal, streamed (interleaved, subtransaction aborts), two-phase,
spilling beyond the memory bound, and protocol violations."""

from __future__ import annotations

import os
import pathlib

import pytest

from router.stream import changes as changes_module
from router.errors import ProtocolViolation
from router.pgoutput import (
    UNCHANGED_TOAST, Begin, BeginPrepare, Commit, CommitPrepared, Decoder, Delete, Insert,
    Message, Origin, Prepare, Relation, RelationColumn, RollbackPrepared, StreamAbort,
    StreamCommit, StreamPrepare, StreamStart, StreamStop, Truncate, Update,
)
from router.pgoutput.render import parse_line
from router.stream.relations import RelationCache
from router.stream.transactions import (
    Change, NonTransactionalMessage, PreparedOutcome, Transaction, TransactionAssembler,
)

GOLDEN = pathlib.Path(__file__).resolve().parent / "pgoutput" / "golden"

COLS = (RelationColumn(1, "id", 23, -1), RelationColumn(0, "v", 25, -1))
REL = Relation(100, "public", "t", "d", COLS)
REL2 = Relation(100, "public", "t", "d", COLS + (RelationColumn(0, "w", 23, -1),))
OTHER = Relation(200, "public", "u", "f", COLS)


def assembler(**kw) -> TransactionAssembler:
    a = TransactionAssembler(RelationCache(), **kw)
    a.feed(1, REL)
    a.feed(1, OTHER)
    return a


def feed_all(a, msgs, start_lsn=10):
    events = []
    for i, msg in enumerate(msgs):
        events += a.feed(start_lsn + i, msg)
    return events


def ins(i, xid=None, rel=100):
    return Insert(rel, (str(i), f"v{i}"), xid)


def values(txn: Transaction):
    return [c.new[0] if c.new else c.op for c in txn.changes]


def test_normal_transaction():
    a = assembler()
    events = feed_all(a, [
        Begin(500, 7, 42), Origin(0xABC, "node_b"), ins(1), Update(100, ("1", None), None, ("2", "x")),
        Update(100, None, None, ("2", UNCHANGED_TOAST)), Delete(200, None, ("2", "x")),
        Truncate(3, (100, 200)), Message(True, 12, "p", b"c"),
        Commit(0, 500, 520, 7)])
    (txn,) = events
    assert (txn.xid, txn.final_lsn, txn.commit_lsn, txn.end_lsn, txn.commit_time) == (
        42, 500, 500, 520, 7)
    assert (txn.origin_name, txn.origin_lsn, txn.gid) == ("node_b", 0xABC, None)
    changes = list(txn.changes)
    assert txn.change_count == len(changes) == 6
    assert [c.op for c in changes] == ["insert", "update", "update", "delete", "truncate",
                                       "message"]
    assert changes[0] == Change("insert", 12, REL, None, False, ("1", "v1"))
    assert changes[1].old == ("1", None) and changes[1].old_is_key
    assert changes[2].old is None and changes[2].new[1] is UNCHANGED_TOAST
    assert changes[3].relation is OTHER and changes[3].old == ("2", "x")
    assert not changes[3].old_is_key
    assert changes[4].relations == (REL, OTHER) and changes[4].options == 3
    assert changes[5].message.content == b"c"
    assert [c.lsn for c in changes] == list(range(12, 18))
    assert list(txn.changes) == changes  # re-iterable
    assert a.memory == 0


def test_relation_change_mid_transaction():
    a = assembler()
    (txn,) = feed_all(a, [Begin(9, 0, 1), ins(1), REL2, Insert(100, ("2", "b", "3")),
                          Commit(0, 9, 10, 0)])
    first, second = txn.changes
    assert first.relation is REL and second.relation is REL2
    assert a.relations.get(100) is REL2


def test_non_transactional_message_is_released_at_once():
    a = assembler()
    msg = Message(False, 5, "hb", b"")
    assert a.feed(5, msg) == [NonTransactionalMessage(5, msg)]
    a.feed(6, Begin(9, 0, 1))
    assert a.feed(7, msg) == [NonTransactionalMessage(7, msg)]


def test_interleaved_streams_with_subtransaction_aborts():
    a = assembler()
    events = feed_all(a, [
        StreamStart(10, True), ins(1, 10), ins(2, 11), StreamStop(),
        StreamStart(20, True), ins(100, 20), ins(101, 21), StreamStop(),
        StreamStart(10, False), ins(3, 12), ins(4, 11), ins(5, 10), StreamStop(),
        StreamAbort(10, 11),  # drops 2 and 4
        StreamStart(20, False), ins(102, 20), StreamStop(),
        StreamAbort(20, 20),  # all of 20
        StreamStart(10, False), ins(6, 10), StreamStop(),
    ])
    assert events == [] and a.open_streams == (10,)
    (txn,) = a.feed(99, StreamCommit(10, 0, 900, 950, 77))
    assert txn.streamed and txn.xid == 10 and (txn.commit_lsn, txn.end_lsn) == (900, 950)
    assert values(txn) == ["1", "3", "5", "6"] and txn.change_count == 4
    assert a.open_streams == () and a.memory == 0


def test_streamed_subtransaction_changes_dropped_after_spill(tmp_path, monkeypatch):
    a = assembler(memory_limit=2000, spill_dir=str(tmp_path))
    msgs = [StreamStart(10, True)]
    msgs += [ins(i, 10 if i % 3 else 11) for i in range(60)]
    msgs += [StreamStop(), StreamAbort(10, 11), StreamStart(10, False), ins(1000, 12),
             StreamStop()]
    assert feed_all(a, msgs) == []
    assert a.spill_count > 0
    (txn,) = a.feed(999, StreamCommit(10, 0, 1, 2, 3))
    assert txn.changes.spilled
    expected = [str(i) for i in range(60) if i % 3] + ["1000"]
    assert values(txn) == expected and txn.change_count == len(expected)
    # the router reads the same changes as lists (spilled ones in runs of RUN_SIZE)
    monkeypatch.setattr(changes_module, "RUN_SIZE", 7)
    runs = list(txn.changes.runs())
    assert [c for run in runs for c in run] == list(txn.changes)
    assert len(runs) > 2 and all(len(run) <= 7 for run in runs[:-1])


def test_spill_to_disk_and_read_back(tmp_path, monkeypatch):
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    big = "x" * 1000
    msgs = [Begin(5000, 1, 7)]
    for i in range(300):
        msgs.append(Insert(100, (str(i), big if i % 2 else UNCHANGED_TOAST)))
        if i == 150:
            msgs.append(REL2)
    msgs += [Update(100, ("1", None), None, ("1", None, "4")), Delete(200, None, ("1", None)),
             Truncate(1, (100,)), Message(True, 3, "p", b"\x00")]
    msgs.append(Commit(0, 5000, 5001, 1))
    limited = assembler(memory_limit=64 * 1024, spill_dir=str(spill_dir))
    # a file is created in spill_dir (anonymous: it is unlinked at once, so watch opens)
    opened = []
    real_open = os.open

    def spy(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    (spilled,) = feed_all(limited, msgs)
    monkeypatch.undo()
    assert limited.spill_count >= 2 and spilled.changes.spilled
    assert any(p.startswith(str(spill_dir)) for p in opened)
    assert limited.memory <= 64 * 1024
    (in_memory,) = feed_all(assembler(), msgs)
    assert not in_memory.changes.spilled
    assert list(spilled.changes) == list(in_memory.changes)
    assert list(spilled.changes) == list(in_memory.changes)  # second pass reads again
    assert spilled.change_count == in_memory.change_count == 304
    changes = list(spilled.changes)
    assert changes[0].new[1] is UNCHANGED_TOAST
    assert changes[150].relation == REL and changes[151].relation == REL2
    assert changes[-2].relations == (REL2,) and changes[-1].message.content == b"\x00"


@pytest.mark.parametrize("mode", ["commit", "prepare"])
def test_two_phase_commit_and_rollback(mode):
    a = assembler(emit_prepared_at=mode)
    first = feed_all(a, [BeginPrepare(300, 320, 5, 8, "g1"), ins(1), ins(2),
                         Prepare(0, 300, 320, 5, 8, "g1")])
    second = feed_all(a, [BeginPrepare(400, 420, 6, 9, "g2"), ins(3),
                          Prepare(0, 400, 420, 6, 9, "g2")])
    normal = feed_all(a, [Begin(450, 6, 10), ins(4), Commit(0, 450, 460, 6)])
    assert values(normal[0]) == ["4"]
    committed = a.feed(500, CommitPrepared(0, 500, 520, 7, 8, "g1"))
    rolled_back = a.feed(600, RollbackPrepared(0, 420, 620, 6, 8, 9, "g2"))
    if mode == "commit":
        assert first == second == [] and a.pending_prepared == {}
        (txn,) = committed
        assert (txn.gid, txn.xid, txn.final_lsn, txn.commit_lsn, txn.end_lsn,
                txn.commit_time, txn.prepared) == ("g1", 8, 300, 500, 520, 7, False)
        assert values(txn) == ["1", "2"]
        assert rolled_back == []
    else:
        (txn,) = first
        assert (txn.gid, txn.commit_lsn, txn.end_lsn, txn.prepared) == ("g1", 300, 320, True)
        assert values(txn) == ["1", "2"] and values(second[0]) == ["3"]
        assert committed == [PreparedOutcome(8, "g1", True, 500, 520, 7)]
        assert rolled_back == [PreparedOutcome(9, "g2", False, 620, 620, 8)]


def test_stream_prepare_then_commit_prepared():
    a = assembler()
    assert feed_all(a, [StreamStart(30, True), ins(1, 30), ins(2, 31), StreamStop(),
                        StreamAbort(30, 31), StreamPrepare(0, 70, 80, 1, 30, "gs")]) == []
    assert a.pending_prepared == {"gs": 30}
    (txn,) = a.feed(90, CommitPrepared(0, 90, 95, 2, 30, "gs"))
    assert txn.streamed and txn.gid == "gs" and values(txn) == ["1"]


def test_stream_prepare_then_rollback_prepared():
    a = assembler()
    feed_all(a, [StreamStart(30, True), ins(1, 30), StreamStop(),
                 StreamPrepare(0, 70, 80, 1, 30, "gs")])
    assert a.feed(90, RollbackPrepared(0, 80, 95, 1, 2, 30, "gs")) == []
    assert a.pending_prepared == {} and a.memory == 0


@pytest.mark.parametrize("msgs", [
    [ins(1)],                                                     # change outside a txn
    [Commit(0, 1, 2, 3)],                                         # commit without begin
    [Begin(1, 0, 1), Begin(2, 0, 2)],                             # nested begin
    [Begin(1, 0, 1), Commit(0, 2, 3, 0)],                         # commit LSN mismatch
    [Begin(1, 0, 1), StreamStart(5, True)],                       # stream inside txn
    [StreamStart(5, True), Begin(1, 0, 1)],                       # begin inside stream
    [StreamStart(5, True), StreamStart(6, True)],                 # nested stream
    [StreamStop()],                                               # stop outside stream
    [StreamStart(5, False)],                                      # unknown continuation
    [StreamStart(5, True), StreamStop(), StreamStart(5, True)],   # first segment twice
    [StreamCommit(5, 0, 1, 2, 3)],                                # unknown stream commit
    [StreamAbort(5, 6)],                                          # unknown stream abort
    [StreamStart(5, True), StreamCommit(5, 0, 1, 2, 3)],          # commit inside block
    [Prepare(0, 1, 2, 3, 4, "g")],                                # prepare without begin
    [BeginPrepare(1, 2, 3, 4, "g"), Commit(0, 1, 2, 3)],          # commit of a 2PC txn
    [BeginPrepare(1, 2, 3, 4, "g"), Prepare(0, 1, 2, 3, 4, "h")], # gid mismatch
    [CommitPrepared(0, 1, 2, 3, 4, "nope")],                      # unknown gid (commit mode)
    [Origin(1, "x")],                                             # origin outside a txn
    [Message(True, 1, "p", b"")],                                 # transactional, no txn
    [Begin(1, 0, 1), Insert(999, ("1",))],                        # relation never described
])
def test_protocol_violations(msgs):
    with pytest.raises(ProtocolViolation):
        feed_all(assembler(), msgs)


def replay(name, version, **kw):
    decoder = Decoder(version)
    a = TransactionAssembler(RelationCache(), **kw)
    events = []
    for lineno, line in enumerate((GOLDEN / name).read_text().splitlines(), 1):
        lsn, data = parse_line(line, lineno)
        events += a.feed(lsn, decoder.decode(data))
    return a, events


def test_golden_streams_assemble(tmp_path):
    a, events = replay("v2_stream.tsv", 2, memory_limit=256 * 1024, spill_dir=str(tmp_path))
    txns = [e for e in events if isinstance(e, Transaction)]
    streamed, small, message = txns
    assert streamed.streamed and streamed.changes.spilled and a.spill_count > 0
    ids = [int(c.new[0]) for c in streamed.changes]
    assert len(ids) == streamed.change_count == 1601
    assert ids[:400] == list(range(1, 401)) and ids[-1] == 60000
    assert not any(50001 <= i <= 50400 for i in ids)  # the rolled back savepoint
    assert all(c.relation.name == "bulk" for c in streamed.changes)
    lsns = [c.lsn for c in streamed.changes]
    assert streamed.commit_lsn > max(lsns)
    assert values(small) == ["70000"] and small.final_lsn > streamed.commit_lsn
    assert message.changes and next(iter(message.changes)).message.content == b"streamed message"
    assert a.open_streams == () and a.memory == 0


def test_golden_two_phase_assembles():
    for mode in ("commit", "prepare"):
        a, events = replay("v3_twophase.tsv", 3, emit_prepared_at=mode)
        txns = [e for e in events if isinstance(e, Transaction)]
        if mode == "commit":
            assert [t.gid for t in txns] == ["golden_commit", "golden_streamed"]
            assert txns[1].change_count == 1000 and txns[1].streamed
        else:
            assert [t.gid for t in txns] == ["golden_commit", "golden_rollback",
                                             "golden_streamed"]
            outcomes = [(e.gid, e.committed) for e in events if isinstance(e, PreparedOutcome)]
            assert outcomes == [("golden_commit", True), ("golden_rollback", False),
                                ("golden_streamed", True)]
        assert a.pending_prepared == {}


def test_golden_v1_assembles():
    _, events = replay("v1_text.tsv", 1)
    txns = [e for e in events if isinstance(e, Transaction)]
    assert len(txns) == 15
    assert [e.message.content for e in events if isinstance(e, NonTransactionalMessage)] == [
        b"non-transactional"]
    assert txns[-1].origin_name == "golden_node" and txns[-1].origin_lsn == 0xABCDEF
    ends = [t.end_lsn for t in txns]
    assert ends == sorted(ends)
    altered = txns[-2]
    first, second, third = altered.changes
    assert first.op == "message"
    assert len(second.relation.columns) == 11 and len(third.relation.columns) == 12


def _summary(events):
    out = []
    for e in events:
        if isinstance(e, Transaction):
            out.append((e.xid, e.final_lsn, e.commit_lsn, e.end_lsn, e.commit_time,
                        e.origin_name, e.origin_lsn, e.gid, e.change_count, e.streamed,
                        e.prepared, list(e.changes)))
        else:
            out.append(e)
    return out


@pytest.mark.parametrize("name, version", [("v1_text.tsv", 1), ("v1_binary.tsv", 1),
                                           ("v2_stream.tsv", 2), ("v3_twophase.tsv", 3)])
@pytest.mark.parametrize("memory_limit", [64 * 1024 * 1024, 4096])
def test_feed_batch_equals_feed(tmp_path, name, version, memory_limit):
    """The decoder actor's batch path gives the same events, changes and relations as
    feeding message by message, also when transactions spill."""
    rows = [parse_line(line, n) for n, line in
            enumerate((GOLDEN / name).read_text().splitlines(), 1)]
    rows = [r for r in rows if r is not None]
    kw = dict(memory_limit=memory_limit, spill_dir=str(tmp_path))
    one = TransactionAssembler(RelationCache(), **kw)
    decoder = Decoder(version)
    expected = []
    for lsn, data in rows:
        expected += one.feed(lsn, decoder.decode(data))
    batched = TransactionAssembler(RelationCache(), **kw)
    decoder = Decoder(version)
    got = []
    for i in range(0, len(rows), 37):
        got += batched.feed_batch(rows[i:i + 37], decoder.decode)
    assert _summary(got) == _summary(expected) and expected
    assert batched.memory == one.memory == 0
    if memory_limit < 1024 * 1024:
        assert batched.spill_count > 0 and one.spill_count > 0
