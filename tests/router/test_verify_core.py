"""``router.verify.fold``: folding a topic at a position and comparing it with source rows."""

from __future__ import annotations

import msgspec
import pytest

from router.verify.fold import (MISSING, Comparer, Comparison, TopicFold, digest, envelope_of,
                           unpacked)

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
    from router.verify.digests import (bucket_in, bucket_of, bucket_sums, digester, key_text,
                                      pg_text, row_digest)

    assert pg_text(True) == "true" and pg_text(7) == "7" and pg_text("1.10") == "1.10"
    assert pg_text(0.1) == "#3fb999999999999a"  # float8send('0.1'::float8), hex
    assert pg_text("NaN") == "NaN" and pg_text(None) is None
    assert pg_text([1]) != "{1}"  # not a JSON-format value: never what SQL renders
    # key columns by name, whatever the record's order; lengths keep values apart
    assert key_text({"b": "x,1", "a": 2}) == key_text({"a": 2, "b": "x,1"}) == "1=2,3:x,1"
    assert key_text({"id": "5"}) != key_text({"id": 5})  # a consumer's keys differ too
    assert key_text({"a": None}) == "!"
    k = key_text({"id": 1})
    # md5('1=1["id","v"][1,"a"]'), its first 15 hex digits: what the SQL side computes
    assert row_digest(k, {"v": "a", "id": 1}) == 0xd05d18ff16a4567
    # the JSON type is in the digests: what a consumer sees is the value and its type
    for a, b in (("24", 24), ("true", True), (1, True), (1, 1.0), ("#3ff0000000000000", 1.0)):
        assert row_digest(k, {"id": 1, "v": a}) != row_digest(k, {"id": 1, "v": b})
        assert unpacked(digester(7)({"id": 1}, {"v": a})[1])[0] != \
            unpacked(digester(7)({"id": 1}, {"v": b})[1])[0]
    assert row_digest(k, {"id": 1, "v": None}) != row_digest(k, {"id": 1, "v": ""})
    assert row_digest(k, {"id": 1, "v": "a"}) != row_digest(key_text({"id": 2}),
                                                            {"id": 1, "v": "a"})
    # JSON keeps a value from mimicking the next column
    assert row_digest(k, {"a": 'x","y', "b": None}) != row_digest(k, {"a": "x", "b": "y"})
    assert row_digest(k, {"a": "x", "b": "y"}) != row_digest(k, {"a": "x", "c": "y"})
    row = digester(7)
    cols, digests = row({"id": 1}, {"v": "a", "id": 1})
    d = unpacked(digests)
    assert cols == ("id", "v") and len(d) == 4
    assert d[2] == bucket_of(k, 7) and 0 <= d[2] < 7
    assert d[3] == row_digest(k, {"id": 1, "v": "a"})
    # a column's digest tells values apart (values compare by their PostgreSQL text)
    assert row({"id": 1}, {"id": 1, "v": "b"})[1] != row({"id": 1}, {"id": 1, "v": "a"})[1]
    assert row({"id": 1}, {"id": 1, "v": 0.1})[1] == row({"id": 1}, {"v": 0.1, "id": 1})[1]
    fold = TopicFold(1000, digester(3))
    for i in range(20):
        fold.add({"id": i}, envelope_of(rec("r", 10, i, after={"id": i, "v": "x"})))
    sums = bucket_sums(fold.keyed())
    assert set(sums) <= {0, 1, 2} and len(sums) > 1
    assert {bucket_in(r) for r in fold.keyed().values()} == set(sums)
    assert sum(n for n, _ in sums.values()) == 20
    assert sum(h for _, h in sums.values()) == sum(
        row_digest(key_text({"id": i}), {"id": i, "v": "x"}) for i in range(20))
    # a row whose column was carried (unchanged TOAST): its bucket cannot be equal
    fold.add({"id": 3}, envelope_of(rec("u", 20, 0, after={"id": 3}, toast=["v"])))
    sums = bucket_sums(fold.keyed())
    assert sums[bucket_in(fold.keyed()[msgspec.json.encode({"id": 3})])][1] is None
    assert sum(h is None for _, h in sums.values()) == 1


def test_a_big_differing_bucket_is_bisected_down_to_the_damaged_rows():
    """Source sums computed by the rules (as SQL does) against a topic with one row altered
    and one lost, all in one bucket: splitting it leaves only the two rows' sub-buckets."""
    from router.verify.digests import (bucket_sums, differing, digester, key_text, row_digest,
                                      sub_of, sub_sums, subs_for, to_split)

    rows = {i: {"id": i, "v": f"v{i}"} for i in range(3000)}
    fold = TopicFold(1000, digester(1))
    for i, row in rows.items():
        after = dict(row, v="altered") if i == 17 else row
        if i != 2021:
            fold.add({"id": i}, envelope_of(rec("r", 10, i, after=after)))
    keyed = fold.keyed()
    topic = bucket_sums(keyed)
    source = {0: [3000, sum(row_digest(key_text({"id": i}), r) for i, r in rows.items())]}
    differ = differing(source, topic)
    assert differ == {0} and to_split(differ, source, topic, 3000) == set()
    split = to_split(differ, source, topic, 100)
    assert split == {0}
    subs = subs_for(source, topic, split, rows=50)
    assert subs == 60
    mine: dict[int, list] = {}
    for i, r in rows.items():
        acc = mine.setdefault(sub_of(key_text({"id": i}), subs), [0, 0])
        acc[0] += 1
        acc[1] += row_digest(key_text({"id": i}), r)
    theirs, codes = sub_sums(keyed, split, subs)
    assert len(codes) == 2999 and sum(n for n, _ in theirs.values()) == 2999
    bad = differing(mine, theirs)
    assert bad == {sub_of(key_text({"id": 17}), subs), sub_of(key_text({"id": 2021}), subs)}
    # only the rows of those sub-buckets are left to read: about 2 × 3000 / 60
    left = sum(mine[c][0] for c in bad)
    assert left < 200
    # a row whose column was carried (unchanged TOAST) makes its sub-bucket differ too
    fold.add({"id": 99}, envelope_of(rec("u", 20, 0, after={"id": 99}, toast=["v"])))
    theirs, codes = sub_sums(fold.keyed(), split, subs)
    assert differing(mine, theirs) == bad | {sub_of(key_text({"id": 99}), subs)}


def test_the_typed_json_decoder_folds_as_the_general_one():
    """``actors.verify.topic.Decoder.feeder`` (pgrouter's JSON taken apart by a Struct) folds
    every kind of record as ``Decoder.key``/``value`` + ``TopicFold.add`` do."""
    from actors.verify.topic import Decoder
    from router.verify.digests import digester

    enc = msgspec.json.encode
    connect = {"schema": {}, "payload": rec("r", 10, 9, after={"id": 8, "v": "connect"})}
    records = [({"id": 1}, rec("r", 10, 0, after={"id": 1, "v": "a", "big": "x" * 50})),
               ({"id": 2}, rec("r", 10, 1, after={"id": 2, "v": 2.5, "big": None})),
               ({"id": 1}, rec("u", 20, 0, after={"id": 1, "v": "b", "big": "?"},
                               toast=["big"])),
               ({"id": 3}, rec("c", 30, 0, after={"id": 3, "v": True, "big": "y"})),
               ({"id": 4}, rec("u", 40, 0, before={"id": 3},
                               after={"id": 4, "v": True, "big": "y"})),
               ({"id": 2}, rec("d", 50, 0, before={"id": 2})),
               ({"id": 5}, rec("c", 2000, 0, after={"id": 5, "v": "after the cut"})),
               (None, {"op": "m", "message": {"prefix": "p"}, "source": {"commit_lsn": 5}}),
               (None, {"status": "BEGIN", "id": "1"}),
               ({"schema": {}, "payload": {"id": 8}}, connect),
               ({"id": 6}, {"op": "r", "after": [1], "source": {"commit_lsn": 10}}),
               ({"id": 7}, None)]
    raw = [(enc(k) if k is not None else None, enc(v) if v is not None else None)
           for k, v in records]
    decoder = Decoder(None)
    for keyless in (False, True):
        general, typed = (TopicFold(1000, digester(4)) for _ in range(2))
        feed = decoder.feeder(typed, keyless)
        for k, v in raw:
            general.add(None if keyless else decoder.key(k), decoder.value(v))
            feed(k, v)
        assert typed.keyed() == general.keyed() and len(general.keyed()) == (0 if keyless
                                                                             else 4)
        assert typed.keyless() == general.keyless()
        assert (typed.records, typed.after_cut) == (general.records, general.after_cut)
        assert typed.taken() == general.keyed() and typed.rows == {}  # what Comparer takes


@pytest.mark.parametrize("skipped", [b'"\xff":1', b'"x":"\xe9"', b'"source":{"\xc3(":1',
                                     b'"x":[{"\xed\xa0\x80":2}]'])
def test_a_value_that_is_not_utf8_is_refused_by_both_folds(skipped):
    """Bytes that are not UTF-8 in a member the fold skips: a consumer's JSON parser refuses
    the record, so verify names it (the feeder's error naming the key), in the C fold and in
    its twin; both used to fold it (issue 51)."""
    from actors.verify.topic import BadRecord, Decoder
    from router.native import NATIVE
    from router.verify.digests import digester, fold_batch_py, layout_of, row_digests_py
    from router.verify.fold import key_of
    from tests.router.verify_twins import Msg

    v = b'{"op":"r",' + skipped + b',"after":{"id":1},"source":{"commit_lsn":5}}'
    if b'"source"' in skipped:
        v = v.replace(b',"source":{"commit_lsn":5}}', b',"commit_lsn":5}}')
    msgs = [Msg(b'{"id":1}', v)]
    impls = [fold_batch_py] + [f for f in [getattr(NATIVE, "verify_fold", None)] if f]
    for fold_batch in impls:
        decoder, fold = Decoder(None), TopicFold(100, digester(7))
        tools = (decoder._raw.decode, msgspec.json.decode, key_of, layout_of,
                 decoder.feeder(fold, False), row_digests_py)
        with pytest.raises(BadRecord, match=r"""key b'\{"id":1\}'.*not UTF-8"""):
            fold_batch(msgs, {0: 10}, fold.rows, 100, 7, tools)
        assert fold.rows == {} and fold.records == 0
