"""The snapshot core: COPY text rows, positions, watermarks, progress records, chunk windows
and snapshot rows routed with each route's copy semantics."""

from __future__ import annotations

import json

import pytest

from router.formats.envelope import TxContext
from router.pgoutput import Relation
from router.pgoutput.messages import RelationColumn
from router.routing.publications import FilterCache, Planner, config_resolver
from router.routing.change_router import ChangeRouter, RouteSpec
from router.snapshot.core import (PREFIX, TABLE_SHIFT, ChunkWindow, SnapshotState, Watermark,
                             decode_state, decode_watermark, encode_state,
                             encode_watermark, eta, initial_position, parse_copy_data,
                             parse_copy_line, state_key)
from router.snapshot.rows import SnapshotRows

REL = Relation(relation_id=1, namespace="public", name="t", replica_identity="d",
               columns=(RelationColumn(1, "id", 23, -1), RelationColumn(0, "v", 25, -1),
                        RelationColumn(0, "n", 23, -1)))


@pytest.mark.parametrize("line, row", [
    ("1\tabc\t\\N", ("1", "abc", None)),
    ("2\ta\\tb\\nc\\\\d\t3", ("2", "a\tb\nc\\d", "3")),
    ("3\t\\\\N\t4", ("3", "\\N", "4")),  # the text \N, not NULL
    ("4\t\\r\\b\\f\\v\t\\101\\x41", ("4", "\r\b\f\v", "AA")),
    ("5\t\t", ("5", "", "")),
])
def test_copy_text_rows(line, row):
    assert parse_copy_line(line) == row
    assert parse_copy_data(line + "\n" + line + "\n") == [row, row]


def test_null_only_rows_without_backslashes_elsewhere():
    assert parse_copy_data("1\t\\N\n") == [("1", None)]


def test_initial_positions_order_before_the_consistent_point_and_never_collide():
    a = initial_position(1000, 0, 5)
    b = initial_position(1000, 1, 0)
    assert a[0] == b[0] == 999
    assert a[1] < b[1] and b[1] == 1 << TABLE_SHIFT


def test_watermarks_round_trip_and_foreign_messages_are_ignored():
    mark = Watermark("request", "s", chunk="abc", routes=("r",), tables=("public.t",))
    assert decode_watermark(PREFIX, encode_watermark(mark)) == mark
    assert decode_watermark("other", encode_watermark(mark)) is None
    assert decode_watermark(PREFIX, b"not json") is None
    assert decode_watermark(PREFIX, b'{"kind": 1}') is None

    # a repair's request names keys; one written before keys existed still reads
    keyed = Watermark("request", "s", chunk="abc", routes=("r",), tables=("public.t",),
                      keys=((7,), (999,)))
    assert decode_watermark(PREFIX, encode_watermark(keyed)) == keyed
    old = b'{"kind":"request","slot":"s","chunk":"abc","routes":["r"],"tables":["public.t"]}'
    assert decode_watermark(PREFIX, old) == mark and mark.keys == ()


def test_progress_records_are_keyed_by_slot_route_and_table():
    p = SnapshotState("backfill", "s", "running", request="q", route="r", table="public.t",
                 last_key=("7",), rows=3)
    key, value = encode_state(p)
    assert json.loads(key) == {"kind": "backfill", "slot": "s", "route": "r",
                               "table": "public.t"}
    assert decode_state(value) == p
    assert decode_state(b"junk") is None
    assert json.loads(encode_state(SnapshotState("initial", "s", "done"))[0]) == {
        "kind": "initial", "slot": "s"}


def _rel(name="t", cols=REL.columns):
    return Relation(relation_id=2, namespace="public", name=name, replica_identity="d",
                    columns=cols)


def test_window_drops_rows_whose_key_the_stream_changed():
    w = ChunkWindow(("public", "t"), ("id",), (0,))
    rows = [("1", "a", "1"), ("2", "b", "2"), ("3", "c", "3"), ("4", "d", "4"),
            ("5", "e", "5")]
    w.observe("insert", _rel(), None, ("2", "x", "0"))  # inserted inside the window
    w.observe("update", _rel(), ("3", None, None), ("30", "c", "3"))  # key changed: both keys
    w.observe("delete", _rel(), ("4", None, None), None)
    w.observe("update", _rel("other"), None, ("5", "z", "0"))  # another table
    assert w.keep(rows) == [("1", "a", "1"), ("5", "e", "5")]
    assert w.changed == {("2",), ("3",), ("30",), ("4",)}


def test_window_keys_by_name_in_the_streamed_layout():
    # the stream's relation lists the columns in another order (e.g. a partition's root)
    cols = (RelationColumn(0, "v", 25, -1), RelationColumn(1, "id", 23, -1))
    w = ChunkWindow(("public", "t"), ("id",), (0,))
    w.observe("update", _rel(cols=cols), None, ("x", "1"))
    assert w.keep([("1", "a"), ("2", "b")]) == [("2", "b")]


def test_window_completes_unchanged_toast_values_from_the_chunk_row():
    """A streamed update that left a TOASTed value unchanged does not carry it: the chunk row
    is not only dropped but emitted from the latest image, the missing value from the read."""
    from router.pgoutput import UNCHANGED_TOAST as U

    w = ChunkWindow(("public", "t"), ("id",), (0,), ("id", "v", "n"))
    rows = [("1", "blob-1", "10"), ("2", "blob-2", "20"), ("3", "blob-3", "30"),
            ("4", "blob-4", "40"), ("5", "blob-5", "50")]
    w.observe("update", _rel(), None, ("1", U, "11"))
    w.observe("update", _rel(), None, ("1", U, "12"))    # latest image: n 12, v from the read
    w.observe("update", _rel(), None, ("2", "new", "21"))
    w.observe("update", _rel(), None, ("2", U, "22"))    # v carried forward: the stream has it
    w.observe("update", _rel(), None, ("3", U, "31"))
    w.observe("delete", _rel(), ("3", None, None), None)  # deleted: nothing to emit
    w.observe("update", _rel(), ("4", None, None), ("44", U, "41"))  # moved: read under "4"
    assert sorted(w.keep(rows)) == [("1", "blob-1", "12"), ("44", "blob-4", "41"),
                                    ("5", "blob-5", "50")]


def test_truncate_inside_the_window_drops_the_chunk():
    w = ChunkWindow(("public", "t"), ("id",), (0,))
    w.observe("truncate", None, None, None, relations=(_rel(),))
    assert w.spoiled and w.keep([("1",)]) == []


def test_keyless_table_copy_is_spoiled_by_any_change():
    w = ChunkWindow(("public", "t"), (), ())
    assert w.keep([("1",)]) == [("1",)]
    w.observe("insert", _rel(), None, ("9", "x", "1"))
    assert w.spoiled and w.keep([("1",)]) == []


def test_eta():
    assert eta(50, 100, 10.0) == 5.0
    assert eta(50, 0, 10.0) is None and eta(5, 10, 0.0) is None


def _snapshot_rows(where: str | None, columns: list[str] | None) -> SnapshotRows:
    filters = FilterCache()
    planner = Planner("f", config_resolver(frozenset({("public", "t")}), where, columns),
                      frozenset({"insert", "update", "delete", "truncate"}), {}, filters)
    specs = [RouteSpec(name="all", all_tables=True),
             RouteSpec(name="f", tables=frozenset({("public", "t")}), planner=planner),
             RouteSpec(name="none", tables=frozenset({("public", "u")}))]
    return SnapshotRows(ChangeRouter(specs, db="db"), position_headers=True)


def test_snapshot_rows_follow_each_routes_filter_and_column_list():
    rows = _snapshot_rows("n > 1", ["id", "n"])
    tx = TxContext(xid=0, commit_lsn=99, end_lsn=100, commit_time=0)
    chunk = rows.chunk(REL, [("1", "a", "1"), ("2", None, "2"), ("3", "c", None)], tx, 10)
    by_topic: dict = {}
    for topic, key, value, headers in chunk.records:
        by_topic.setdefault(topic, []).append((json.loads(key), json.loads(value), headers))
    assert sorted(by_topic) == ["all.public.t", "f.public.t"]
    assert [v["after"] for _, v, _ in by_topic["all.public.t"]] == [
        {"id": 1, "v": "a", "n": 1}, {"id": 2, "v": None, "n": 2}, {"id": 3, "v": "c", "n": None}]
    # NULL fails the filter, as in PostgreSQL; the column list drops v
    assert [(k, v["after"]) for k, v, _ in by_topic["f.public.t"]] == [({"id": 2}, {"id": 2, "n": 2})]
    for _, v, headers in by_topic["all.public.t"] + by_topic["f.public.t"]:
        assert v["op"] == "r" and v["before"] is None
        assert v["source"]["commit_lsn"] == 99
        assert dict(headers)["pgrouter.commit_lsn"] == b"99"
    # the same row has the same position on every route
    assert by_topic["f.public.t"][0][1]["source"]["seq"] == \
        by_topic["all.public.t"][1][1]["source"]["seq"] == 11
    assert {t for t, _ in chunk.new_topics} == {"all.public.t", "f.public.t"}
    assert len(chunk.schemas) == 2
    again = rows.chunk(REL, [("4", "d", "4")], tx, 13)
    assert again.schemas == [] and again.new_topics == []


def test_repair_deletes_are_keyed_records_of_routes_publishing_delete():
    rows = _snapshot_rows("n > 1", ["id", "n"])
    tx = TxContext(xid=0, commit_lsn=99, end_lsn=100, commit_time=0)
    chunk = rows.deletes(REL, [("999",)], (0,), tx, 5)
    got = sorted((t, json.loads(k), json.loads(v)) for t, k, v, _ in chunk.records)
    # every route taking the table, whatever its filter (the row is gone, only its key known)
    assert [t for t, _, _ in got] == ["all.public.t", "f.public.t"]
    for _, key, value in got:
        assert key == {"id": 999} and value["op"] == "d" and value["after"] is None
        assert value["before"]["id"] == 999 and value["source"]["seq"] == 5


def test_changes_committed_before_the_window_but_invisible_to_the_read_count():
    from router.stream.changes import Change
    from router.snapshot.core import RecentChanges, snapshot_xip

    assert snapshot_xip("100:105:101,4294967399") == frozenset({101, 103})
    assert snapshot_xip("100:100:") == frozenset()
    recent = RecentChanges(limit=3)
    recent.add(7, Change("update", 1, _rel(), None, False, ("1", "a", "1")))   # visible
    recent.add(9, Change("delete", 2, _rel(), ("2", None, None), True, None))  # invisible
    low = recent.count
    recent.add(9, Change("insert", 3, _rel(), None, False, ("3", "c", "3")))   # after low
    w = ChunkWindow(("public", "t"), ("id",), (0,))
    recent.replay(w, low, frozenset({9}))
    assert w.keep([("1",), ("2",), ("3",)]) == [("1",), ("3",)]
    # bounded: the oldest changes are forgotten
    for i in range(5):
        recent.add(1, Change("insert", 4, _rel(), None, False, (str(i), "x", "0")))
    assert len(recent.changes) == 3


# -- block ranges (router.snapshot.ranges) ---------------------------------------------------


def test_block_ranges_cover_the_table_and_split_only_big_ones():
    from router.snapshot.ranges import MAX_RANGES, MIN_RANGE_BLOCKS, block_ranges

    assert block_ranges(10 * MIN_RANGE_BLOCKS, 1) == [(0, None)]  # one session
    assert block_ranges(2 * MIN_RANGE_BLOCKS - 1, 4) == [(0, None)]  # too small
    parts = block_ranges(10 * MIN_RANGE_BLOCKS, 2)
    assert len(parts) == 8  # 4 a session
    assert parts[0][0] == 0 and parts[-1][1] is None  # from block 0, open at the end
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # no gap, no overlap
    assert all(b - a >= MIN_RANGE_BLOCKS for a, b in parts[:-1])
    assert len(block_ranges(10**9, 1000)) == MAX_RANGES
    # a range's rows stay well within its positions: more ranges for a huge table
    assert len(block_ranges(10**8, 2, rows=10**11)) == 94  # ceil(4e11 / 2^32)


def test_done_blocks_are_this_snapshots_merged_and_dropped_after_a_rewrite():
    from router.snapshot.ranges import done_blocks

    def rng(first, end, request="s1", filenode=7, table="public.t", slot="slot"):
        return SnapshotState("range", slot, "done", request=request, table=table,
                             blocks=(first, end), filenode=filenode)

    states = [rng(100, 200), rng(0, 100), rng(300, -1), rng(200, 300, request="old"),
              rng(0, 50, table="public.u"), rng(0, 50, slot="other"),
              SnapshotState("initial", "slot", "started", request="s1")]
    assert done_blocks(states, "slot", "s1", "public.t", 7) == [(0, 200), (300, None)]
    assert done_blocks(states, "slot", "s1", "public.t", 8) == []  # rewritten since
    assert done_blocks(states, "slot", "", "public.t", 7) == []  # an unnamed snapshot
    assert done_blocks(states + [rng(200, 300)], "slot", "s1", "public.t", 7) == [(0, None)]


def test_range_states_are_keyed_by_their_blocks():
    a = SnapshotState("range", "s", "done", table="public.t", blocks=(0, 10))
    b = SnapshotState("range", "s", "done", table="public.t", blocks=(10, -1))
    assert state_key(a) != state_key(b)
    assert decode_state(encode_state(b)[1]) == b
