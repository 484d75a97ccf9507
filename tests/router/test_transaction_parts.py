"""A large non-streamed transaction released in parts while it arrives
(``TransactionAssembler(part_changes=…)``) and routed part by part: joined, the parts are
the whole transaction, and its records are the whole transaction's."""

from __future__ import annotations

import random
import struct

import pytest

from router.pgoutput import Decoder, Relation, RelationColumn
from router.routing.change_router import ChangeRouter, RouteSpec
from router.stream.changes import Change, Changes
from router.stream.relations import RelationCache
from router.stream.transactions import Transaction, TransactionAssembler
from tests.router.test_native import assemble, check_feed_batch, gen_stream, native

PART = 50


def _joined(events) -> list:
    """The summaries (``assemble``'s) with each transaction's parts joined to its rest."""
    out, open_parts = [], {}
    for e in events:
        if not isinstance(e, tuple):
            out.append(e)
            continue
        *head, changes, first_seq, partial = e
        before = open_parts.pop(head[0], [])
        assert first_seq == len(before), "positions go on from the parts before"
        if partial:
            assert head[3] == 0 and head[2] == head[1], "a part: end unknown, commit LSN known"
            assert {c.op for c in changes} <= {"insert", "update", "delete"}
            open_parts[head[0]] = before + changes
            continue
        joined = before + changes
        head[8] = len(joined)  # change_count
        head[9] = False  # spilled: a whole-mode detail
        out.append((*head, joined, 0, False))
    assert not open_parts
    return out


@native
@pytest.mark.parametrize("memory_limit", [64 << 20, 20_000, 0])
def test_parts_joined_are_the_whole_transaction(monkeypatch, tmp_path, memory_limit):
    rng = random.Random(memory_limit + 1)
    rows = gen_stream(rng, 120)
    cuts = sorted({0, len(rows), *rng.sample(range(len(rows)), 80)})
    # the native and the Python path release the same parts (check_feed_batch compares)
    (events, _), _ = check_feed_batch(monkeypatch, tmp_path, rows, 1, memory_limit, cuts,
                                      part_changes=PART)
    whole, _ = assemble(rows, 1, False, memory_limit, cuts, str(tmp_path))
    assert sum(e[-1] for e in events) > 5, "some transactions were released in parts"
    assert _joined(events) == [
        (*e[:9], False, e[10], 0, False) if isinstance(e, tuple) else e for e in whole]


def _messages(rows: int, message_at: int | None = None) -> list[tuple[int, bytes]]:
    rel = b"R" + struct.pack("!I", 1) + b"public\0t\0d" + struct.pack("!H", 1)
    rel += b"\x01id\0" + struct.pack("!Ii", 23, -1)
    final = 0x50000000
    msgs = [rel, b"B" + struct.pack("!QqI", final, 7, 900)]
    for i in range(rows):
        if i == message_at:
            msgs.append(b"M" + struct.pack("!BQ", 1, final) + b"p\0\0\0\0\x03abc")
        v = b"%d" % i
        msgs.append(b"I" + struct.pack("!IcH", 1, b"N", 1) + b"t" + struct.pack("!I", len(v)) + v)
    msgs.append(b"C" + struct.pack("!BQQq", 0, final, final + 8, 7))
    return [(0x10000000 + i, m) for i, m in enumerate(msgs)]


def _feed(msgs, part_changes, batch=100) -> list:
    a = TransactionAssembler(RelationCache(), part_changes=part_changes)
    decode = Decoder(1).decode
    events = []
    for start in range(0, len(msgs), batch):
        events += a.feed_batch(msgs[start:start + batch], decode)
    return events


def test_parts_only_until_the_first_message_and_never_below_the_threshold():
    events = _feed(_messages(1000, message_at=450), part_changes=200)
    parts = [e for e in events if e.partial]
    # parts at batch ends (100 messages: Relation, Begin, 98 rows, then 100 rows each) once
    # 200 changes are buffered; from the message on, the rest whole
    assert [e.first_seq for e in events] == [0, 298, 398]
    assert [e.change_count for e in parts] == [298, 100]
    last = events[-1]
    assert not last.partial and last.end_lsn == 0x50000008 and last.change_count == 1001 - 398
    assert events[-1].commit_time == parts[0].commit_time == 7
    assert [e.partial for e in _feed(_messages(150), part_changes=200)] == [False]
    assert [e.partial for e in _feed(_messages(1000), part_changes=None)] == [False]
    # a message before the threshold: never in parts
    assert [e.partial for e in _feed(_messages(1000, message_at=10), part_changes=200)] == [False]


REL = Relation(1, "public", "t", "d", (RelationColumn(1, "id", 23, -1),))


def _txn(changes, first_seq=0, partial=False) -> Transaction:
    return Transaction(9, 0x500, 0x500, 0 if partial else 0x508, 7, None, None, None,
                       Changes(changes, [], None, (), frozenset(), len(changes)),
                       len(changes), first_seq=first_seq, partial=partial)


def test_parts_route_to_the_whole_transactions_records():
    changes = [Change("insert", 0x100 + i, REL, new=(str(i),)) for i in range(5000)]
    router = ChangeRouter([RouteSpec(name="r", planner=lambda rel: {})], db="d",
                          position_headers=True)
    whole = [r for c in router.route(_txn(changes)) for r in c.records]
    router = ChangeRouter([RouteSpec(name="r", planner=lambda rel: {})], db="d",
                          position_headers=True)
    chunks = []
    for start, stop, partial in ((0, 1234, True), (1234, 4000, True), (4000, 5000, False)):
        chunks += router.route(_txn(changes[start:stop], start, partial))
    assert [r for c in chunks for r in c.records] == whole
    assert [c.last for c in chunks].count(True) == 1 and chunks[-1].last
    assert chunks[-1].end_lsn == 0x508 and {c.end_lsn for c in chunks[:-1]} == {0}
    # a part is never routed the short way (its positions and its open end)
    assert router.route_short(_txn(changes[:3], 0, True)) is None
    assert router.route_short(_txn(changes[:3], 10, False)) is None
