"""Routing with PostgreSQL's publication semantics (pgoutput_row_filter): the UPDATE
transformation table, NULL is false, unchanged TOAST, truncate never filtered, via root."""

from __future__ import annotations

import json

import pytest

from router.stream.changes import Change
from router.formats.envelope import TableEncoder, TxContext
from router.errors import ProtocolViolation
from router.pgoutput import UNCHANGED_TOAST, Message, Relation, RelationColumn
from router.routing.plans import TablePlan, apply_plan
from router.routing.change_router import ChangeRouter, RouteSpec

INT4, TEXT = 23, 25
REL = Relation(1, "public", "t", "d", (RelationColumn(1, "id", INT4, -1),
                                       RelationColumn(0, "v", INT4, -1),
                                       RelationColumn(0, "big", TEXT, -1)))
U = UNCHANGED_TOAST


def v_over_5(row):
    return row[1] is not None and row[1] is not U and int(row[1]) > 5


def plan(**kw):
    return TablePlan(route="r", topic="t", encoder=TableEncoder(REL, route="r", db="d"), **kw)


def update(old, new, old_is_key=False):
    return Change("update", 1, REL, old=old, old_is_key=old_is_key, new=new)


@pytest.mark.parametrize("old, new, expected", [
    (("1", "1", "x"), ("1", "2", "x"), None),                            # no/no: dropped
    (("1", "1", "x"), ("1", "9", "x"), ("c", None, ("1", "9", "x"))),   # no/yes: insert
    (("1", "9", "x"), ("1", "1", "x"), ("d", ("1", "9", "x"), None)),   # yes/no: delete
    (("1", "9", "x"), ("1", "8", "x"), ("u", ("1", "9", "x"), ("1", "8", "x"))),
    (("1", None, "x"), ("1", "9", "x"), ("c", None, ("1", "9", "x"))),  # NULL is false
])
def test_update_transformation_table(old, new, expected):
    got = apply_plan(plan(update_filter=v_over_5), update(old, new))
    assert (got and (got[0], got[1], got[3])) == expected if expected else got is None


def test_update_without_old_tuple_checks_new_row_only():
    p = plan(update_filter=v_over_5)
    assert apply_plan(p, update(None, ("1", "9", "x")))[0] == "u"
    assert apply_plan(p, update(None, ("1", "1", "x"))) is None


def test_unchanged_toast_filled_from_old_for_filter_and_insert_only():
    def big_is_x(row):
        return row[2] == "x"
    p = plan(update_filter=big_is_x)
    # old matches, new (filled) matches: UPDATE keeps the tuple as sent ('u' stays)
    got = apply_plan(p, update(("1", "1", "x"), ("1", "2", U)))
    assert got[0] == "u" and got[3] == ("1", "2", U)
    # transformed INSERT carries the filled row
    got = apply_plan(plan(update_filter=lambda r: r[1] == "2"),
                      update(("1", "1", "x"), ("1", "2", U)))
    assert got[0] == "c" and got[3] == ("1", "2", "x")
    # a NULL in the old tuple (key-only) does not replace the unchanged value
    got = apply_plan(plan(update_filter=lambda r: r[1] == "2"),
                      update(("1", None, None), ("1", "2", U), old_is_key=True))
    assert got[0] == "c" and got[3] == ("1", "2", U)


def test_transformed_change_not_rechecked_against_actions():
    p = plan(update_filter=v_over_5, publish_insert=False, publish_delete=False)
    assert apply_plan(p, update(("1", "1", "x"), ("1", "9", "x")))[0] == "c"
    assert apply_plan(p, update(("1", "9", "x"), ("1", "1", "x")))[0] == "d"


def test_insert_delete_filters_and_actions():
    p = plan(insert_filter=v_over_5, delete_filter=v_over_5)
    assert apply_plan(p, Change("insert", 1, REL, new=("1", "9", "x")))[0] == "c"
    assert apply_plan(p, Change("insert", 1, REL, new=("1", None, "x"))) is None
    assert apply_plan(p, Change("delete", 1, REL, old=("1", "1", None), old_is_key=True)) is None
    assert apply_plan(plan(publish_delete=False),
                       Change("delete", 1, REL, old=("1", None, None))) is None


class _Txn:
    first_seq, partial = 0, False  # a whole transaction (Transaction's fields)

    def __init__(self, changes):
        self.xid, self.commit_lsn, self.end_lsn, self.commit_time = 5, 100, 101, 0
        self.origin_name = self.origin_lsn = None
        self.changes = changes


CHILD = Relation(2, "public", "child", "d", (RelationColumn(0, "v", INT4, -1),
                                             RelationColumn(1, "id", INT4, -1)))
OTHER = Relation(3, "public", "other", "d", (RelationColumn(1, "id", INT4, -1),))
ROOT = Relation(0, "public", "parent", "d", (RelationColumn(1, "id", INT4, -1),
                                             RelationColumn(0, "v", INT4, -1)))


class _ViaRootPlanner:
    """child is published as parent (via root); other as itself with a filter; parent, when
    its own TRUNCATE is marked, as itself."""

    def __call__(self, rel):
        if rel.name == "child":
            return {"publish_as": ROOT, "row_map": (1, 0), "via_ancestor": True,
                    "insert_filter": lambda row: row[0] == "3"}
        if rel.name == "other":
            return {"insert_filter": lambda row: False}
        if rel.name == "parent":
            return {}
        return None

    def relation_of(self, table):
        return ROOT if table == ("public", "parent") else None


def _via_root_router():
    return ChangeRouter([RouteSpec(name="r", planner=_ViaRootPlanner())], db="d")


def _mark(lsn, content=b'["public", "parent"]'):
    return Change("message", lsn, message=Message(True, lsn, "pgrouter.truncate", content))


def _routed(router, changes):
    records = [r for c in router.route(_Txn(changes)) for r in c.records]
    return [(r[0], json.loads(r[2])["op"], json.loads(r[2])["source"]["lsn"]) for r in records]


def test_via_root_rows_mapped_and_a_partitions_truncate_is_not_the_roots():
    """pgoutput sends no TRUNCATE of a partition published as its ancestor, and the ancestor's
    only when the statement truncated the ancestor itself (marked), whatever its leaves."""
    router = _via_root_router()
    changes = [Change("insert", 10, CHILD, new=("7", "3")),
               Change("insert", 11, CHILD, new=("7", "4")),
               Change("truncate", 12, relations=(CHILD, OTHER))]
    chunks = list(router.route(_Txn(changes)))
    records = [r for c in chunks for r in c.records]
    assert [r[0] for r in records] == ["r.public.parent", "r.public.other"]
    first = json.loads(records[0][2])
    assert first["after"] == {"id": 3, "v": 7} and first["source"]["table"] == "parent"
    assert json.loads(records[0][1]) == {"id": 3}
    assert [json.loads(r[2])["op"] for r in records] == ["c", "t"]


def test_a_marked_root_is_truncated_with_its_statement():
    got = _routed(_via_root_router(), [_mark(11), Change("truncate", 12, relations=(CHILD,),
                                                         options=1)])
    assert got == [("r.public.parent", "t", 12)]
    # the stream naming the root too (a slot publication via root): one record
    got = _routed(_via_root_router(), [_mark(11), Change("truncate", 12,
                                                         relations=(ROOT, CHILD))])
    assert got == [("r.public.parent", "t", 12)]


def test_a_marked_root_without_a_truncate_is_sent_before_the_next_change():
    got = _routed(_via_root_router(), [_mark(11), Change("insert", 13, CHILD, new=("7", "3"))])
    assert got == [("r.public.parent", "t", 11), ("r.public.parent", "c", 13)]
    assert _routed(_via_root_router(), [_mark(11)]) == [("r.public.parent", "t", 11)]


def test_a_marker_naming_no_table_is_a_protocol_violation():
    with pytest.raises(ProtocolViolation, match="marker"):
        _routed(_via_root_router(), [_mark(11, b"{}")])


def test_replace_routes_applies_from_next_transaction():
    router = _via_root_router()
    router.replace_routes([])
    assert [r for c in router.route(_Txn([Change("insert", 1, CHILD, new=("7", "3"))]))
            for r in c.records] == []


def test_remembered_decisions_equal_direct_evaluation():
    """With ``filter_columns`` the router remembers decisions per filtered values; the
    records must be the same as evaluating every plan for every change."""
    def spec(name, k):
        def planner(rel):
            f = (lambda row: row[1] is not None and int(row[1]) % 3 == k)
            return {"insert_filter": f, "update_filter": f, "delete_filter": f,
                    "filter_columns": (1,) if name.startswith("m") else None}
        return RouteSpec(name=name, planner=planner)
    changes = []
    for i in range(30):
        changes.append(Change("insert", i, REL, new=(str(i), str(i % 5), "x")))
    for i in range(30):
        changes.append(Change("update", 100 + i, REL, old=(str(i), str(i % 5), "x"),
                              new=(str(i), str((i + 1) % 5), U)))
        changes.append(Change("update", 200 + i, REL, old=None, new=(str(i), str(i % 4), "y")))
        changes.append(Change("delete", 300 + i, REL, old=(str(i), str(i % 7), None),
                              old_is_key=True))

    def records(prefix):
        router = ChangeRouter([spec(f"{prefix}{k}", k) for k in range(3)], db="d")
        out = []
        for c in router.route(_Txn(changes)):
            for topic, key, value, _ in c.records:
                v = json.loads(value)
                v["source"].pop("route")
                out.append((topic[len(prefix):], key, v))
        return out
    remembered, direct = records("m"), records("d")
    assert remembered == direct and len(direct) > 60


def test_full_identity_table_is_keyed_by_its_primary_key():
    from router.pgoutput import Relation, RelationColumn
    from router.routing.change_router import ChangeRouter

    rel = Relation(relation_id=9, namespace="public", name="f", replica_identity="f",
                   columns=(RelationColumn(1, "id", 23, -1), RelationColumn(1, "v", 25, -1)))
    keyed = ChangeRouter([], db="d", primary_keys={("public", "f"): ("id",)}).keyed(rel)
    assert [c.flags & 1 for c in keyed.columns] == [1, 0]
    no_pk = ChangeRouter([], db="d").keyed(rel)
    assert no_pk is rel, "without a primary key the identity (every column) stays the key"
    default = Relation(relation_id=9, namespace="public", name="f", replica_identity="d",
                       columns=rel.columns)
    assert ChangeRouter([], db="d", primary_keys={("public", "f"): ("id",)}).keyed(default) is default


@pytest.mark.parametrize("position_headers", [False, True])
def test_position_headers_on_filtered_and_direct_records(position_headers):
    """``position_headers`` puts (commit_lsn, seq) on every change record, whether a route
    filters (evaluated per change) or publishes as is (the direct path); none without it."""
    def planner(rel):
        return {"insert_filter": v_over_5} if rel.name == "t" else None
    other = Relation(2, "public", "u", "d", REL.columns)
    router = ChangeRouter([RouteSpec(name="f", planner=planner),
                           RouteSpec(name="a", all_tables=True)], db="d",
                          position_headers=position_headers)
    changes = [Change("insert", 1, REL, new=("1", "9", "x")),
               Change("insert", 2, other, new=("2", "1", "y")),
               Change("insert", 3, REL, new=("3", "7", "z"))]
    records = [r for c in router.route(_Txn(changes)) for r in c.records]
    # t goes through the filter of route f (every plan evaluated), u the direct path
    assert [(r[0], json.loads(r[2])["source"]["seq"]) for r in records] == [
        ("f.public.t", 0), ("a.public.t", 0), ("a.public.u", 1), ("f.public.t", 2),
        ("a.public.t", 2)]
    for _, _, value, headers in records:
        src = json.loads(value)["source"]
        want = [("pgrouter.commit_lsn", b"100"),
                ("pgrouter.seq", b"%d" % src["seq"])] if position_headers else None
        assert headers == want
