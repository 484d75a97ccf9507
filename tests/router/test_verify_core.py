"""``router.verify``: folding a topic at a position and comparing it with source rows."""

from __future__ import annotations

import pytest

from router.verify import (MISSING, Comparer, Comparison, TopicFold, digest, envelope_of,
                           packed, unpacked)

ALL = frozenset({"insert", "update", "delete", "truncate"})


def rec(op, lsn, seq=0, before=None, after=None, toast=None):
    env = {"op": op, "before": before, "after": after,
           "source": {"commit_lsn": lsn, "seq": seq}}
    if toast:
        env["unchanged_toast"] = toast
    return env


def folded(records, cut=1000, keyless=False):
    fold = TopicFold(cut)
    for key, env in records:
        fold.add(None if keyless else key, envelope_of(env))
    return fold


def compare(fold, rows, actions=ALL, keyless=False):
    c = Comparer(Comparison("r", "t", ["public.t"]), fold, actions)
    for row in rows:
        c.row(None if keyless else {"id": row["id"]}, row)
    return c.finish()


def test_latest_record_per_key_with_deletes_and_the_cut():
    fold = folded([({"id": 1}, rec("r", 10, 0, after={"id": 1, "v": "a"})),
                   ({"id": 2}, rec("r", 10, 1, after={"id": 2, "v": "b"})),
                   ({"id": 1}, rec("u", 20, 0, after={"id": 1, "v": "a2"})),
                   ({"id": 2}, rec("d", 30, 0, before={"id": 2})),
                   ({"id": 3}, rec("c", 1000, 0, after={"id": 3, "v": "after the cut"}))])
    r = compare(fold, [{"id": 1, "v": "a2"}])
    assert (r.compared, r.matching, r.missing, r.extra, r.different) == (1, 1, 0, 0, 0)
    assert fold.after_cut == 1


def test_duplicates_by_position_change_nothing():
    a = ({"id": 1}, rec("c", 10, 0, after={"id": 1, "v": "new"}))
    old = ({"id": 1}, rec("r", 5, 0, after={"id": 1, "v": "old"}))
    fold = folded([old, a, old, a, ({"id": 1}, rec("d", 5, 1, before={"id": 1}))])
    assert compare(fold, [{"id": 1, "v": "new"}]).ok


def test_unchanged_toast_is_carried_and_missing_when_lost():
    first = ({"id": 1}, rec("r", 10, after={"id": 1, "big": "x" * 5000, "n": 1}))
    update = ({"id": 1}, rec("u", 20, after={"id": 1, "n": 2}, toast=["big"]))
    want = [{"id": 1, "big": "x" * 5000, "n": 2}]
    assert compare(folded([first, update]), want).ok
    lost = compare(folded([update]), want)
    assert lost.different == 1 and lost.different_keys == [{"key": {"id": 1},
                                                             "columns": ["big"]}]
    [(cols, digests)] = folded([update]).keyed().values()
    assert dict(zip(cols, unpacked(digests)))["big"] == MISSING


def test_connect_placeholder_of_unchanged_toast_is_not_a_value():
    env = {"schema": {}, "payload": rec("u", 20, after={"id": 1, "big":
                                                        "__debezium_unavailable_value"},
                                        toast=["big"])}
    assert envelope_of(env)["after"] == {"id": 1}
    assert envelope_of({"schema": {}, "payload": {"op": "m"}}) is None


def test_key_change_of_the_json_format_removes_the_old_key():
    fold = folded([({"id": 1}, rec("r", 10, after={"id": 1, "v": "a"})),
                   ({"id": 9}, rec("u", 20, before={"id": 1}, after={"id": 9, "v": "a"}))])
    r = compare(fold, [{"id": 9, "v": "a"}])
    assert r.ok and r.compared == 1


def test_truncate_drops_rows_before_it():
    fold = folded([({"id": 1}, rec("r", 10, after={"id": 1})),
                   (None, rec("t", 20)),
                   ({"id": 2}, rec("c", 30, after={"id": 2}))])
    r = compare(fold, [{"id": 2}])
    assert r.ok


def test_missing_extra_different_with_examples():
    fold = folded([({"id": i}, rec("r", 10, i, after={"id": i, "v": "v"})) for i in range(1, 5)])
    r = compare(fold, [{"id": 1, "v": "v"}, {"id": 2, "v": "w"}, {"id": 7, "v": "v"}])
    assert (r.missing, r.extra, r.different) == (1, 2, 1)
    assert r.missing_keys == [{"id": 7}] and sorted(k["id"] for k in r.extra_keys) == [3, 4]
    assert r.different_keys == [{"key": {"id": 2}, "columns": ["v"]}]


@pytest.mark.parametrize("actions, counts", [
    (ALL, (0, 1, 0, 0)),
    (frozenset({"insert", "update"}), (0, 0, 0, 1)),  # no DELETE: the deleted row is kept
])
def test_route_actions(actions, counts):
    fold = folded([({"id": 1}, rec("r", 10, after={"id": 1})),
                   ({"id": 2}, rec("r", 10, 1, after={"id": 2}))])
    r = compare(fold, [{"id": 1}], actions)
    assert (r.missing, r.extra, r.different, r.kept) == counts


def test_without_update_values_are_not_compared():
    fold = folded([({"id": 1}, rec("c", 10, after={"id": 1, "v": "as inserted"}))])
    assert compare(fold, [{"id": 1, "v": "updated"}], frozenset({"insert", "delete"})).ok


def test_keyless_rows_are_a_multiset_in_position_order():
    row = {"a": 1, "b": "x"}
    fold = folded([(None, rec("c", 30, 0, after=row)),
                   (None, rec("d", 40, 0, before=row)),
                   (None, rec("r", 10, 0, after=row)),
                   (None, rec("r", 10, 1, after=row)),
                   (None, rec("u", 50, 0, before=row, after={"a": 2, "b": "y"}))], keyless=True)
    # 3 copies, one deleted, one updated away: one x left, one y
    r = Comparer(Comparison("r", "t", []), fold, ALL)
    r.row(None, row)
    r.row(None, {"a": 2, "b": "y"})
    assert r.finish().ok
    r = Comparer(Comparison("r", "t", []), fold, ALL)
    r.row(None, row)
    r.row(None, row)
    r.row(None, {"a": 2, "b": "y"})
    done = r.finish()
    assert (done.missing, done.extra) == (1, 0) and done.missing_keys == [row]


def test_digests_tell_json_types_apart():
    assert digest(1) != digest("1") != digest(1.0) and digest(None) != digest("null")
    assert digest({"b": 1, "a": 2}) == digest({"a": 2, "b": 1})


def test_bucket_digest_texts_are_what_postgresql_renders():
    from router.verify_digest import (bucket_of, bucket_sums, column_digest, key_text, pg_text,
                                      row_columns)

    assert pg_text(True) == "true" and pg_text(7) == "7" and pg_text("1.10") == "1.10"
    assert pg_text(0.1) == "3fb999999999999a"  # float8send('0.1'::float8), hex
    assert pg_text("NaN") == "NaN" and pg_text(None) is None
    assert pg_text([1]) != "{1}"  # not a JSON-format value: never what SQL renders
    # key columns by name, whatever the record's order; lengths keep values apart
    assert key_text({"b": "x,1", "a": 2}) == key_text({"a": 2, "b": "x,1"}) == "1:2,3:x,1"
    assert key_text({"a": None}) == "!"
    k = key_text({"id": 1})
    assert column_digest(k, "v", None) != column_digest(k, "v", "")
    assert column_digest(k, "v", "a") != column_digest(key_text({"id": 2}), "v", "a")
    cols, digests = row_columns({"id": 1}, {"id": 1, "v": "a"})
    assert cols == ("id", "v") and unpacked(digests)[1] == column_digest(k, "v", "a")
    assert 0 <= bucket_of(k, 7) < 7
    fold = folded([({"id": i}, rec("r", 10, i, after={"id": i})) for i in range(20)])
    sums, where = bucket_sums({key: packed(("id",), [5]) for key in fold.keyed()}, 3)
    assert len(where) == 20 and set(where.values()) <= {0, 1, 2}
    assert sum(n for n, _ in sums.values()) == 20 and sum(h for _, h in sums.values()) == 100
