"""The applier's pure parts: reassembling transactions across topics (router.apply.reassembly),
the SQL it runs (router.apply.statements) and its config (router.config.applier)."""

from __future__ import annotations

import json
import re

import pytest

from router.config.applier import parse_apply_config
from router.errors import ApplyError, ConfigError, DecodeError
from router.apply.reassembly import Reassembler
from router.apply.statements import TargetTable, affected, to_text
from tests.helpers import APPLY_CONFIG


def end(lsn: int, counts: dict[str, int]) -> bytes:
    return json.dumps({"status": "END", "id": f"7:{lsn}", "event_count": sum(counts.values()),
                       "data_collections": [{"data_collection": t, "event_count": n}
                                            for t, n in counts.items()],
                       "ts_ms": 0, "source": {"commit_lsn": lsn, "xid": 7,
                                              "commit_time": "2026-01-01T00:00:00Z"}}).encode()


def rec(lsn: int, seq: int, op: str = "c", table: str = "t") -> bytes:
    return json.dumps({"op": op, "before": None, "after": {"id": seq},
                       "source": {"commit_lsn": lsn, "seq": seq, "schema": "public",
                                  "table": table, "route": "r"}}).encode()


def test_released_in_commit_order_when_complete():
    ra = Reassembler(lambda t: t != "skip")
    assert ra.add_transaction_record(end(100, {"x": 2, "y": 1, "skip": 5})) == ["x", "y"]
    assert ra.add_transaction_record(end(200, {"x": 1})) == []
    ra.add_record("x", rec(200, 0))  # the later transaction completes first …
    ra.add_record("x", rec(100, 1))
    assert list(ra.ready()) == []  # … but never overtakes
    ra.add_record("y", rec(100, 0))
    ra.add_record("x", rec(100, 1))  # duplicate (re-sent after a router restart)
    assert list(ra.ready()) == []
    ra.add_record("x", rec(100, 2))
    first, second = list(ra.ready())
    assert (first.commit_lsn, second.commit_lsn) == (100, 200)
    assert [(t, r.source.seq) for t, r in first.records] == [("y", 0), ("x", 1), ("x", 2)]
    assert ra.duplicates == 1 and ra.pending == 0


def test_duplicates_and_applied_transactions_are_skipped():
    ra = Reassembler(lambda t: True, applied_lsn=150)
    ra.add_transaction_record(end(100, {"x": 1}))  # applied already
    ra.add_record("x", rec(100, 0))
    assert ra.pending == 0
    ra.add_transaction_record(end(200, {"x": 1}))
    ra.add_transaction_record(end(200, {"x": 1}))  # re-sent END
    ra.add_record("x", rec(200, 0))
    assert [t.commit_lsn for t in ra.ready()] == [200]
    ra.add_record("x", rec(200, 0))  # late duplicate of an applied transaction
    assert list(ra.ready()) == [] and ra.pending == 0


def test_begin_records_and_garbage():
    ra = Reassembler(lambda t: True)
    begin = json.loads(end(100, {}))
    begin.update(status="BEGIN", event_count=None, data_collections=None)
    assert ra.add_transaction_record(json.dumps(begin).encode()) == [] and ra.pending == 0
    with pytest.raises(DecodeError):
        ra.add_transaction_record(b"{")
    with pytest.raises(DecodeError):
        ra.add_record("x", b'{"op": 1}')


TABLE = TargetTable("public", "t", {"id": "integer", "v": "text", "b": "boolean"}, ("id",))


def test_statements():
    sql, args = TABLE.insert({"id": 1, "v": "a", "b": True}, "error")
    assert sql == ('insert into "public"."t" ("id", "v", "b") values ($1::text::integer, '
                   '$2::text::text, $3::text::boolean)')
    assert args == ["1", "a", "t"]
    sql, _ = TABLE.insert({"id": 1, "v": "a"}, "upsert")
    assert sql.endswith('on conflict ("id") do update set "v" = excluded."v" returning (xmax = 0)')
    sql, args = TABLE.update({"id": 1}, {"id": 2, "v": None})  # key change
    assert sql == ('update "public"."t" set "id" = $1::text::integer, "v" = $2::text::text '
                   'where "id" = $3::text::integer')
    assert args == ["2", None, "1"]
    sql, args = TABLE.update(None, {"id": 2, "b": False})
    assert args == ["2", "f", "2"]
    sql, args = TABLE.delete({"id": 3})
    assert sql == 'delete from "public"."t" where "id" = $1::text::integer' and args == ["3"]
    assert TABLE.truncate({"cascade": True, "restart_identity": True}).endswith(
        "restart identity cascade")
    keyless = TargetTable("s", "k", {"a": "integer", "b": "text"}, ())
    sql, args = keyless.delete({"a": 1, "b": None})
    assert "is not distinct from" in sql and "limit 1" in sql and args == ["1", None]
    with pytest.raises(ApplyError):
        TABLE.insert({"id": 1, "nope": 2}, "error")
    with pytest.raises(ApplyError):
        keyless.update(None, {"a": 1})
    assert affected("UPDATE 0") == 0 and affected("INSERT 0 3") == 3
    assert to_text(1.5) == "1.5" and to_text(None) is None and to_text(7) == "7"


APPLY = APPLY_CONFIG


def test_apply_config():
    cfg = parse_apply_config(APPLY)
    assert cfg.kafka.topics == ["*"] and cfg.target.conflict == "error"
    assert cfg.kafka.client == "auto" and cfg.target.synchronous_commit == "off"
    assert cfg.target.progress_table == "public.pgrouter_apply_progress"
    for text, path in [(APPLY.replace('"node_a"', '"pg_x"'), "target.origin"),
                       (APPLY.replace('"a.tx"', '""'), "kafka.transactions_topic"),
                       (APPLY + 'conflict = "sometimes"\n', "target.conflict"),
                       (APPLY + "memory_limit = 1000\n", "target.memory_limit"),
                       (APPLY + 'progress_table = "nodot"\n', "target.progress_table"),
                       (APPLY.replace("[target]", 'client = "x"\n[target]'), "kafka.client")]:
        with pytest.raises(ConfigError) as info:
            parse_apply_config(text)
        assert info.value.path == path, str(info.value)


def test_resume_offsets_cover_every_unreleased_record():
    ra = Reassembler(lambda t: True, transactions_topic="tx")
    ra.add_record("x", rec(100, 0), partition=0, offset=10)
    ra.add_record("x", rec(200, 1), partition=1, offset=4)  # a later transaction, read early
    ra.add_record("x", rec(100, 1), partition=1, offset=5)
    ra.add_transaction_record(end(100, {"x": 2}), 7)
    ra.add_transaction_record(end(200, {"x": 2}), 8)
    (txn,) = list(ra.ready())
    assert txn.commit_lsn == 100 and txn.count == 2
    # partition 1 restarts at 200's record (4), the transaction topic at 200's END (8)
    assert txn.resume == {"tx/0": 8, "x/0": 11, "x/1": 4}
    # a partition not read since the start keeps the position reading started from
    ra = Reassembler(lambda t: True, transactions_topic="tx", positions={"x/2": 9, "tx/0": 7})
    ra.add_transaction_record(end(300, {"x": 1}), 7)
    ra.add_record("x", rec(300, 0), partition=0, offset=12)
    (txn,) = list(ra.ready())
    assert txn.resume == {"tx/0": 8, "x/0": 13, "x/2": 9}


def test_released_a_slice_at_a_time_with_resume_at_the_end_of_the_round():
    """``ready(limit)``: the applier's consumer releases 500 at a time and lets the writer
    run in between; the restart offsets come with the last one of the round only."""
    ra = Reassembler(lambda t: True, transactions_topic="tx")
    for i in range(5):
        ra.add_transaction_record(end(100 + i, {"x": 1}), i)
        ra.add_record("x", rec(100 + i, i), offset=i)
    ra.add_transaction_record(end(200, {"x": 1}), 5)  # its record not read yet
    first, second, third = list(ra.ready(2)), list(ra.ready(2)), list(ra.ready(2))
    assert [[t.commit_lsn for t in s] for s in (first, second, third)] == [
        [100, 101], [102, 103], [104]]
    assert [t.resume for t in first + second] == [None] * 4
    assert third[0].resume == {"tx/0": 5, "x/0": 5}
    assert list(ra.ready(2)) == [] and ra.pending == 1


def test_skipped_counts_what_the_target_already_has():
    ra = Reassembler(lambda t: True, applied_lsn=200)
    for lsn in (100, 100, 200, 300):
        ra.add_transaction_record(end(lsn, {"x": 1}))
    assert ra.skipped == 2 and ra.duplicates == 1 and ra.pending == 1


def test_spills_past_the_memory_limit_and_reads_back_in_order(tmp_path):
    ra = Reassembler(lambda t: True, memory_limit=20_000, spill_dir=str(tmp_path))
    n = 600
    for seq in range(n):  # two partitions, each in change order
        ra.add_record("x", rec(100, seq), partition=seq % 2, offset=seq)
    ra.add_record("x", rec(100, 5), partition=1, offset=n)  # a re-sent duplicate
    assert ra.spills >= 1 and ra.memory <= 20_000 and ra.duplicates == 1
    ra.add_transaction_record(end(100, {"x": n}))
    (txn,) = list(ra.ready())
    assert txn.records.spilled and txn.count == n
    for _ in range(2):  # read back twice: a failed fast path applies it again
        assert [r.source.seq for _, r in txn.records] == list(range(n))
    txn.records.close()


def test_set_based_statements():
    from router.apply.batches import Prepared, statements
    from router.apply.reassembly import _decode_data

    def r(op, before, after):
        return ("x", _decode_data(json.dumps({"op": op, "before": before, "after": after,
                                              "source": {"schema": "public", "table": "t"}},
                                             separators=(",", ":"))))
    tables = {("public", "t"): TABLE}
    recs = [r("c", None, {"id": 1, "v": "it's"}), r("c", None, {"id": 2, "v": None}),
            r("u", None, {"id": 1, "v": "a"}), r("u", None, {"id": 2, "v": "b"}),
            r("u", None, {"id": 1, "v": "c"}),  # key 1 again: a new run
            r("u", {"id": 2}, {"id": 3, "v": "d"}),  # a key change: another shape
            r("d", {"id": 1}, None), r("d", {"id": 3}, None)]
    prepared = Prepared()
    out = list(statements(recs, tables, prepared))
    assert out[0] == ('insert into "public"."t" ("id", "v") select "id", "v" from '
                      'json_populate_recordset(null::"public"."t", \'[{"id":1,"v":"it\'\'s"},'
                      '{"id":2,"v":null}]\')')
    # a json column would get its text as a JSON string from json_populate_recordset
    with_json = TargetTable("public", "t", TABLE.columns, ("id",), frozenset({"v"}))
    assert list(statements(recs[:2], {("public", "t"): with_json}))[0] == (
        'insert into "public"."t" ("id", "v") values (\'1\', \'it\'\'s\'), (\'2\', NULL)')
    assert out[1].startswith('with _w as (update "public"."t" as _t set "id" = _d._c0')
    assert "('1'::integer, '1'::integer, 'a'::text), ('2', '2', 'b')" in out[1]
    assert out[1].endswith("select 1 / (count(*) = 2)::int from _w")
    assert out[2] == "execute pgr_0('1', '1', 'c')" and out[3] == "execute pgr_1('2', '3', 'd')"
    assert out[4] == ('with _w as (delete from "public"."t" where "id" = any '
                      "(array['1', '3']::integer[]) returning 1) select 1 / (count(*) = 2)::int "
                      "from _w")
    assert len(out) == 5 and len(prepared.new) == 2
    assert prepared.new[1] == ('prepare pgr_1(text, text, text) as with _w as (update '
                               '"public"."t" set "id" = $2::integer, "v" = $3::text where '
                               '"id" = $1::integer returning 1) select 1 / (count(*) = 1)::int '
                               'from _w')


def test_prepared_statements_of_a_new_set_are_never_named_as_a_dropped_set_named_theirs():
    """The writer drops its prepared statements after a failure and starts a new set: a
    script made with the old set (the next batch, made ahead) must fail on a name that no
    longer exists rather than execute another statement of the same name."""
    from router.apply.batches import Prepared

    old = Prepared()
    first = old.execute(("origin",), ["0/1", None], lambda: "select $1, $2")
    assert first.name == "pgr_0"
    new = Prepared(old.next_number)
    other = new.execute(("c", "t"), ["1"], lambda: "select $1")
    assert other.name == "pgr_1" and new.new == ["prepare pgr_1(text) as select $1"]
    assert new.execute(("origin",), ["0/2", None], lambda: "select $1, $2").name == "pgr_2"


def test_snapshot_rows_are_upserts():
    from router.apply.batches import Prepared, statements
    from router.apply.records import _decode_data

    prepared = Prepared()
    table = TargetTable("public", "t", {"id": "integer", "v": "text"}, ("id",))
    recs = [("x", _decode_data(json.dumps({
        "op": "r", "after": {"id": i, "v": f"v{i}"},
        "source": {"commit_lsn": 9, "seq": i, "schema": "public", "table": "t"}}).encode()))
        for i in (1, 2)]
    (many,) = statements(recs, {("public", "t"): table}, prepared, upsert=True)
    assert many.endswith(' on conflict ("id") do update set "v" = excluded."v"')
    (one,) = statements(recs[:1], {("public", "t"): table}, prepared, upsert=True)
    assert prepared.new[-1].endswith(' on conflict ("id") do update set "v" = excluded."v"')
    (plain,) = statements(recs[:1], {("public", "t"): table}, prepared)
    assert plain != one and "on conflict" not in prepared.new[-1]


def snap(lsn: int, seq: int, xid: int) -> bytes:
    return json.dumps({"op": "r", "before": None, "after": {"id": seq},
                       "source": {"commit_lsn": lsn, "seq": seq, "xid": xid,
                                  "schema": "public", "table": "t", "route": "r"}}).encode()


def released(ra: Reassembler) -> list:
    return [(t.commit_lsn, t.snapshot, [r.source.seq for _, r in t.records])
            for t in ra.ready()]


def test_snapshot_rows_are_released_at_their_place_in_commit_order():
    ra = Reassembler(lambda t: True)
    # an initial snapshot (xid 0, at the consistent point - 1) goes out before any END
    ra.add_records("x", 0, [(0, snap(99, 0, 0)), (1, snap(99, 1, 0))])
    ra.add_transaction_record(end(100, {"x": 1}), 0)
    ra.add_records("x", 0, [(2, rec(100, 0))])
    assert released(ra) == [(99, True, [0, 1]), (100, False, [0])]
    # backfill rows at a high watermark's transaction (200) wait for it, then go right
    # after it and before the next one
    ra.add_records("x", 0, [(3, snap(200, 5, 8)), (4, snap(200, 6, 8))])
    assert released(ra) == []  # END 200 not read yet
    ra.add_transaction_record(end(200, {}), 1)
    ra.add_transaction_record(end(300, {"x": 1}), 2)
    ra.add_records("x", 0, [(5, rec(300, 0))])
    out = released(ra)
    assert out == [(200, False, []), (200, True, [5, 6]), (300, False, [0])]
    # rows at the target's progress are kept (the high watermark may be applied already)
    ra2 = Reassembler(lambda t: True, applied_lsn=200)
    ra2.add_records("x", 0, [(0, snap(150, 1, 8)), (1, snap(200, 2, 8))])
    ra2.add_transaction_record(end(300, {}), 0)
    assert released(ra2) == [(200, True, [2]), (300, False, [])]


def test_insert_runs_end_where_table_layout_op_or_size_change():
    """Consecutive inserts of one layout (``schema_id``) are one statement; a run ends at
    another layout, table or operation and at ``MAX_RUN`` rows, never reordering rows."""
    from router.apply import batches
    from router.apply.batches import Prepared, statements
    from router.apply.records import _decode_data

    seq = iter(range(10_000))

    def r(op, row, table="t", schema_id="L1", before=None):
        return ("x", _decode_data(json.dumps({
            "op": op, "before": before, "after": row,
            "source": {"schema": "public", "table": table, "seq": next(seq),
                       "schema_id": schema_id}}, separators=(",", ":"))))
    u = TargetTable("public", "u", {"id": "integer", "v": "text"}, ("id",))
    tables = {("public", "t"): TABLE, ("public", "u"): u}
    recs = ([r("c", {"id": i, "v": f"a{i}"}) for i in range(3)]
            + [r("c", {"id": 3}, schema_id="L2")]  # another layout: fewer columns
            + [r("c", {"id": 4, "v": None})]  # back to the first layout
            + [r("c", {"id": 5, "v": "x"}, table="u")]  # another table
            + [r("c", {"id": 6, "v": "y"}), r("c", {"id": 7, "v": "z"})]
            + [r("d", None, before={"id": 6})]  # another operation
            + [r("c", {"id": i, "v": None}) for i in range(8, 8 + batches.MAX_RUN + 2)])
    out = list(statements(recs, tables, Prepared()))

    def ids(stmt):
        return [int(x) for x in re.findall(r'\{"id":(\d+)', stmt)]
    assert ids(out[0]) == [0, 1, 2] and '"v"' in out[0]
    assert out[1].startswith("execute pgr_0(") and "'3'" in out[1]  # one row: prepared
    assert out[2].startswith("execute pgr_1(") and "'4', NULL" in out[2]
    assert out[3].startswith("execute pgr_2(")  # table u
    assert ids(out[4]) == [6, 7]
    assert out[5].startswith("execute pgr_3(")  # the one-row delete
    assert ids(out[6]) == list(range(8, 8 + batches.MAX_RUN))  # MAX_RUN rows a statement
    assert ids(out[7]) == list(range(8 + batches.MAX_RUN, 8 + batches.MAX_RUN + 2))
    assert len(out) == 8
