"""Golden bytes from PostgreSQL 15 (see capture_golden.py): every message type decodes to the
values the workload wrote."""

from __future__ import annotations

import pytest

from router.pgoutput import (
    UNCHANGED_TOAST, Begin, BeginPrepare, Commit, CommitPrepared, Decoder, Delete, Insert,
    Message, Origin, Prepare, Relation, RollbackPrepared, StreamAbort, StreamCommit,
    StreamPrepare, StreamStart, StreamStop, Truncate, Type, Update, pg_time_to_iso,
)

from conftest import CAPTURES


def decode_all(rows, version):
    decoder = Decoder(version)
    return [(lsn, decoder.decode(data)) for lsn, data in rows]


@pytest.mark.parametrize("name", CAPTURES)
def test_every_message_decodes_with_its_version_and_with_v4(golden, name):
    low = decode_all(golden[name], CAPTURES[name])
    high = decode_all(golden[name], 4)
    assert low == high
    assert len(low) == len(golden[name]) > 0


def of(msgs, cls):
    return [msg for _, msg in msgs if type(msg) is cls]


def test_v1_text(golden):
    msgs = decode_all(golden["v1_text.tsv"], 1)
    types = {type(msg) for _, msg in msgs}
    assert types == {Begin, Commit, Origin, Relation, Type, Insert, Update, Delete, Truncate,
                     Message}
    rels = {r.name: r for r in of(msgs, Relation)}
    items = rels["items"]
    assert items.namespace == "golden" and items.replica_identity == "d"
    assert items.key_columns == ("id",)
    assert [c.name for c in items.columns][:3] == ["id", "label", "price"]
    assert items.columns[2].type_modifier == (10 << 16 | 2) + 4  # numeric(10,2)
    assert rels["full_ri"].replica_identity == "f"
    assert rels["full_ri"].key_columns == ("id", "note")
    assert rels["idx_ri"].replica_identity == "i" and rels["idx_ri"].key_columns == ("a", "b")
    mood = of(msgs, Type)[0]
    assert (mood.namespace, mood.name) == ("golden", "mood")
    assert items.columns[8].type_oid == mood.type_oid

    first = of(msgs, Insert)[0]
    assert first.relation_id == items.relation_id and first.xid is None
    assert first.new[:10] == ("1", "first", "12.50", "t", "2024-01-02 03:04:05.123456+00",
                              "\\xdeadbeef", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
                              '{"k": [1, 2]}', "happy", "{a,b}")
    assert first.new[10] == "x" * 10000
    assert of(msgs, Insert)[1].new[2:] == (None,) * 9

    updates = of(msgs, Update)
    toast = updates[0]
    assert toast.key is None and toast.old is None
    assert toast.new[1] == "first, updated" and toast.new[10] is UNCHANGED_TOAST
    key_change = updates[1]
    assert key_change.key[0] == "2" and key_change.new[:2] == ("3", "second")
    assert updates[2].old == ("1", "one") and updates[2].new == ("1", "uno")
    assert updates[3].key == ("1", "2", None) and updates[3].new == ("1", "3", "v")

    deletes = of(msgs, Delete)
    assert deletes[0].key[0] == "3" and deletes[0].old is None
    assert deletes[1].old == ("1", "uno") and deletes[1].key is None
    assert deletes[2].key == ("1", "3", None)

    (truncate,) = of(msgs, Truncate)
    assert truncate.options == 3  # CASCADE | RESTART IDENTITY
    assert set(truncate.relation_ids) == {rels["parent"].relation_id, rels["child"].relation_id}

    plain, transactional = of(msgs, Message)
    assert (plain.transactional, plain.prefix, plain.content) == (False, "golden",
                                                                 b"non-transactional")
    assert (transactional.transactional, transactional.content) == (True, b"\x00\xff")

    (origin,) = of(msgs, Origin)
    assert origin.name == "golden_node" and origin.commit_lsn == 0xABCDEF


def test_v1_transactions_are_consistent(golden):
    msgs = decode_all(golden["v1_text.tsv"], 1)
    begins, commits = of(msgs, Begin), of(msgs, Commit)
    assert len(begins) == len(commits) == 15
    for begin, commit in zip(begins, commits):
        assert begin.final_lsn == commit.commit_lsn < commit.end_lsn
        assert begin.commit_time == commit.commit_time
    xids = [b.xid for b in begins]
    assert xids == sorted(xids)
    ends = [c.end_lsn for c in commits]
    assert ends == sorted(ends)
    origin_txn = begins[-1]
    assert pg_time_to_iso(origin_txn.commit_time) == "2024-05-06T07:08:09.000001+00:00"


def test_v1_relation_changes_inside_a_transaction(golden):
    msgs = decode_all(golden["v1_text.tsv"], 1)
    seen = [msg for _, msg in msgs if type(msg) in (Relation, Insert)]
    before = next(i for i, m in enumerate(seen) if type(m) is Insert and m.new[1:2] == ("before alter",))
    after = next(i for i, m in enumerate(seen) if type(m) is Insert and m.new[1:2] == ("after alter",))
    relations_between = [m for m in seen[before:after] if type(m) is Relation]
    assert [c.name for c in relations_between[-1].columns][-1] == "extra"
    assert len(seen[after].new) == 12 and seen[after].new[-1] == "7"


def test_v1_binary(golden):
    msgs = decode_all(golden["v1_binary.tsv"], 1)
    first = of(msgs, Insert)[0]
    assert first.new[0] == b"\x00\x00\x00\x01"  # int4 send format
    assert first.new[1] == b"first"
    assert first.new[5] == b"\xde\xad\xbe\xef"
    assert first.new[6].hex() == "a0eebc999c0b4ef8bb6d6bb9bd380a11"
    assert of(msgs, Update)[0].new[10] is UNCHANGED_TOAST
    assert of(msgs, Insert)[1].new[2] is None


def test_v2_streaming(golden):
    msgs = decode_all(golden["v2_stream.tsv"], 2)
    starts = of(msgs, StreamStart)
    assert len(starts) == len(of(msgs, StreamStop)) > 4
    top = {s.xid for s in starts}
    assert len(top) == 2
    committed_xid, aborted_xid = sorted(top)
    assert [s.xid for s in starts if s.first_segment] == [committed_xid, aborted_xid]
    # stream blocks of the two transactions interleave
    order = [s.xid for s in starts]
    switches = sum(1 for a, b in zip(order, order[1:]) if a != b)
    assert switches >= 3
    # inside a block every data message carries the (sub)transaction xid
    decoder, inside = Decoder(2), False
    for _, data in golden["v2_stream.tsv"]:
        msg = decoder.decode(data)
        if type(msg) in (Insert, Relation, Message):
            assert (msg.xid is not None) == inside
        inside = decoder.in_stream
    sub_inserts = [m for _, m in msgs if type(m) is Insert and m.new[1:2] == ("rolled back",)]
    assert sub_inserts and {m.xid for m in sub_inserts} - top
    subxid = sub_inserts[0].xid
    aborts = of(msgs, StreamAbort)
    assert StreamAbort(committed_xid, subxid) in aborts
    assert StreamAbort(aborted_xid, aborted_xid) in aborts
    (commit,) = of(msgs, StreamCommit)
    assert commit.xid == committed_xid and commit.commit_lsn < commit.end_lsn
    assert all(a.abort_lsn is None for a in aborts)
    last = [m for _, m in msgs if type(m) is Message][-1]
    assert last.content == b"streamed message" and last.xid is None


def test_v3_two_phase(golden):
    msgs = decode_all(golden["v3_twophase.tsv"], 3)
    begin_prepares = of(msgs, BeginPrepare)
    prepares = of(msgs, Prepare)
    assert [b.gid for b in begin_prepares] == ["golden_commit", "golden_rollback"]
    for b, p in zip(begin_prepares, prepares):
        assert (b.gid, b.xid, b.prepare_lsn, b.end_lsn, b.prepare_time) == (
            p.gid, p.xid, p.prepare_lsn, p.end_lsn, p.prepare_time)
    commits = of(msgs, CommitPrepared)
    assert [c.gid for c in commits] == ["golden_commit", "golden_streamed"]
    assert commits[0].xid == begin_prepares[0].xid
    assert commits[0].commit_lsn >= prepares[0].end_lsn
    (rollback,) = of(msgs, RollbackPrepared)
    assert rollback.gid == "golden_rollback" and rollback.xid == begin_prepares[1].xid
    assert rollback.prepare_end_lsn == prepares[1].end_lsn
    assert rollback.prepare_time == prepares[1].prepare_time < rollback.rollback_time
    (stream_prepare,) = of(msgs, StreamPrepare)
    assert stream_prepare.gid == "golden_streamed"
    assert stream_prepare.xid == commits[1].xid
    assert {s.xid for s in of(msgs, StreamStart)} == {stream_prepare.xid}
    streamed = [m for _, m in msgs if type(m) is Insert and m.xid == stream_prepare.xid]
    assert len(streamed) == 1000
    assert [int(m.new[0]) for m in streamed] == list(range(200001, 201001))
