"""Publication definitions at their position in the stream (router.routing.definitions, following):
snapshots parsed, the state in force at a confirmed position, plans rebuilt in the middle of
a transaction, definitions messages never published as op 'm'."""

from __future__ import annotations

import json

import msgspec

from router.stream.changes import Change
from router.routing.definitions import (PREFIX, Definitions, StateRecord, catalog_from_snapshot,
                                state_at)
from router.pgoutput import Relation, RelationColumn
from router.pgoutput.messages import Message
from router.routing.publications import FilterCache, Planner, publication_resolver
from router.routing.change_router import ChangeRouter, RouteSpec

INT4 = 23
T = Relation(1, "public", "t", "d", (RelationColumn(1, "id", INT4, -1),
                                     RelationColumn(0, "v", INT4, -1)))
OPS = frozenset({"insert", "update", "delete", "truncate"})


def pub(tables, **kw):
    base = {"all_tables": False, "insert": True, "update": True, "delete": True,
            "truncate": True, "via_root": False, "schemas": [], "tables": tables}
    return base | kw


def snapshot(where, **kw):
    return {"publications": {"pf": pub([["public", "t", where, None]], **kw)}, "tables": []}


def message(lsn, snap):
    content = json.dumps({"v": 1, "event": "change", "tag": "ALTER PUBLICATION",
                          "before": None, "after": snap}).encode()
    return Change("message", lsn, message=Message(True, lsn, PREFIX, content))


class _Txn:
    first_seq, partial = 0, False  # a whole transaction (Transaction's fields)

    def __init__(self, changes, commit_lsn=100):
        self.xid, self.commit_lsn, self.end_lsn, self.commit_time = 5, commit_lsn, commit_lsn + 1, 0
        self.origin_name = self.origin_lsn = None
        self.changes = changes


def build(catalog):
    return [RouteSpec(name="r", planner=Planner(
        "r", publication_resolver([catalog.publications["pf"]], catalog), OPS,
        catalog.tables, FilterCache()))]


def definitions(where="v > 10"):
    return Definitions(catalog_from_snapshot(snapshot(where)), build, slot="s", topic="defs",
                       route_publications=["pf"])


def ins(lsn, i, v):
    return Change("insert", lsn, T, new=(str(i), str(v)))


def routed(router, txn):
    return [(r[0], json.loads(r[2])) for c in router.route(txn) for r in c.records]


def test_snapshot_to_catalog_with_partition_tree():
    snap = {"publications": {"p": pub([["s", "root", "(a > 1)", ["a"]]], via_root=True,
                                      schemas=["x"])},
            "tables": [{"schema": "s", "name": "root", "relkind": "p", "replica_identity": "d",
                        "ancestors": [], "columns": [["a", 23, -1, True]]},
                       {"schema": "s", "name": "leaf", "relkind": "r", "replica_identity": "d",
                        "ancestors": [["s", "root"]], "columns": [["a", 23, -1, True]]}]}
    cat = catalog_from_snapshot(snap)
    p = cat.publications["p"]
    assert p.via_root and p.schemas == {"x"} and p.tables[("s", "root")].where == "(a > 1)"
    assert p.tables[("s", "root")].columns == ("a",)
    assert cat.tables[("s", "root")].leaves == {("s", "leaf")}
    assert cat.tables[("s", "leaf")].ancestors == (("s", "root"),)
    assert cat.tables[("s", "root")].columns[0].key


def test_definitions_change_in_the_middle_of_a_transaction():
    defs = definitions("v > 10")
    router = ChangeRouter([], db="d", messages_topic="msgs")
    router.follow(defs)
    got = routed(router, _Txn([ins(1, 1, 5), ins(2, 2, 50), message(3, snapshot("v < 10")),
                               ins(4, 3, 5), ins(5, 4, 50)]))
    data = [(t, v["after"]["id"]) for t, v in got if t == "r.public.t"]
    assert data == [("r.public.t", 2), ("r.public.t", 3)]  # as pgoutput: old, then new filter
    # the message is consumed: a state record, never an op 'm' record
    assert [t for t, _ in got if t != "r.public.t"] == ["defs"]
    state = [v for t, v in got if t == "defs"][0]
    assert (state["slot"], state["lsn"], state["commit_lsn"], state["end_lsn"]) == ("s", 3, 100, 101)
    assert state["snapshot"]["publications"]["pf"]["tables"][0][2] == "v < 10"


def test_other_routers_of_the_pipeline_follow_from_their_next_transaction():
    defs = definitions("v > 10")
    a, b = ChangeRouter([], db="d"), ChangeRouter([], db="d")
    a.follow(defs)
    b.follow(defs, frozenset({"r"}))
    assert routed(b, _Txn([ins(1, 1, 5)])) == []
    routed(a, _Txn([message(3, snapshot("v < 10"))]))
    assert [v["after"]["id"] for _, v in routed(b, _Txn([ins(9, 1, 5)], 200))] == [1]


def test_publish_actions_and_a_missing_publication():
    defs = definitions()
    router = ChangeRouter([], db="d")
    router.follow(defs)
    got = routed(router, _Txn([message(1, snapshot(None, insert=False)), ins(2, 1, 50),
                               message(3, {"publications": {}, "tables": []}), ins(4, 2, 50),
                               message(5, snapshot(None)), ins(6, 3, 50)]))
    assert [v["after"]["id"] for t, v in got if t == "r.public.t"] == [3]


def test_messages_of_the_prefix_are_dropped_without_definitions():
    router = ChangeRouter([RouteSpec(name="r", tables=frozenset({("public", "t")}))], db="d",
                          messages_topic="msgs")
    other = Change("message", 2, message=Message(True, 2, "app", b"x"))
    got = routed(router, _Txn([message(1, snapshot(None)), other]))
    assert [json.loads(json.dumps(v))["message"]["prefix"] for _, v in got] == ["app"]


def _state(slot, end_lsn, lsn, where):
    return msgspec.json.encode(StateRecord(slot=slot, commit_lsn=end_lsn - 1, end_lsn=end_lsn,
                                           lsn=lsn, snapshot=msgspec.Raw(json.dumps(
                                               snapshot(where)).encode())))


def test_state_in_force_at_the_confirmed_position():
    values = [_state("s", 100, 90, "a"), _state("s", 300, 250, "c"), b"not json",
              _state("s", 200, 150, "b1"), _state("s", 200, 160, "b2"), _state("x", 250, 240, "z")]
    assert state_at(values, "s", 99) is None
    assert json.loads(bytes(state_at(values, "s", 100).snapshot))["publications"]["pf"]["tables"][0][2] == "a"
    # records of transactions after the confirmed position are ignored (sent again)
    got = state_at(values, "s", 299)
    assert json.loads(bytes(got.snapshot))["publications"]["pf"]["tables"][0][2] == "b2"
    assert state_at(values, "s", 10**6).end_lsn == 300


def test_transaction_metadata_does_not_count_state_records():
    from router.routing.transaction_meta import TransactionMeta

    defs = definitions("v > 10")
    router = ChangeRouter([], db="d")
    router.follow(defs)
    meta = TransactionMeta("txs", db="d", ignore=frozenset({"defs"}))

    def records(txn):
        return [(r[0], json.loads(r[2])) for c in meta.wrap(txn, router.route(txn))
                for r in c.records]
    only_ddl = records(_Txn([message(1, snapshot("v < 10"))]))
    assert [t for t, _ in only_ddl] == ["defs"]  # no BEGIN/END around bookkeeping alone
    mixed = records(_Txn([ins(2, 1, 5), message(3, snapshot("v > 10")), ins(4, 2, 50)], 300))
    assert [t for t, _ in mixed] == ["txs", "r.public.t", "defs", "r.public.t", "txs"]
    end = mixed[-1][1]
    assert end["event_count"] == 2
    assert end["data_collections"] == [{"data_collection": "r.public.t", "event_count": 2}]
