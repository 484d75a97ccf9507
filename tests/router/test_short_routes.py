"""ChangeRouter.route_short: the one chunk of a short transaction, exactly what route()
gives, or None (before changing anything) where route() must do the work."""

from __future__ import annotations

import random

import pytest

from router.stream.changes import Change, Changes
from router.pgoutput import Relation, RelationColumn
from router.routing.change_router import ChangeRouter, RouteSpec
from router.stream.transactions import Transaction

INT4, TEXT = 23, 25
T = Relation(1, "public", "t", "d", (RelationColumn(1, "id", INT4, -1),
                                     RelationColumn(0, "v", INT4, -1),
                                     RelationColumn(0, "s", TEXT, -1)))
U = Relation(2, "public", "u", "d", (RelationColumn(1, "id", INT4, -1),
                                     RelationColumn(0, "s", TEXT, -1)))
W = Relation(3, "other", "w", "f", (RelationColumn(0, "a", INT4, -1),
                                    RelationColumn(0, "b", TEXT, -1)))


def routes():
    def filtered(rel):
        return {"insert_filter": lambda row: row[0] is not None and int(row[0]) > 5} \
            if rel.name == "w" else None
    return [RouteSpec(name="all", all_tables=True),
            RouteSpec(name="ins", tables=frozenset({("public", "t"), ("public", "u")}),
                      operations=frozenset({"insert", "delete"})),
            RouteSpec(name="flt", tables=frozenset({("other", "w")}), planner=filtered),
            RouteSpec(name="sch", schemas=frozenset({"other"}), topic="{route}.{schema}")]


def change(rng, n):
    rel = rng.choice([T, T, U, W])
    row = tuple(rng.choice([None, str(rng.randint(0, 9))]) if c.type_oid == INT4
                else rng.choice([None, "x\"y", "é"]) for c in rel.columns)
    op = rng.choice(["insert", "insert", "update", "delete", "truncate" if n > 40 else "insert"])
    if op == "truncate":
        return Change("truncate", n, relations=(rel,), options=0)
    if op == "insert":
        return Change("insert", n, rel, new=row)
    if op == "update":
        return Change("update", n, rel, old=row if rel is W else None, new=row)
    return Change("delete", n, rel, old=row, old_is_key=rel is not W)


def transactions(seed: int, count: int):
    rng = random.Random(seed)
    out = []
    for xid in range(count):
        changes = [change(rng, rng.randint(0, 45)) for _ in range(rng.choice([1, 1, 2, 4]))]
        lsn = 0x1000 * (xid + 1)
        out.append(Transaction(xid, lsn, lsn, lsn + 8, 789_000_000_000 + xid, None, None, None,
                               Changes(changes, (), None, (), frozenset(), len(changes)),
                               len(changes)))
    return out


def summary(chunks):
    return [(c.xid, c.commit_lsn, c.end_lsn, c.records, [s.schema_id for s in c.schemas],
             c.last, c.new_topics) for c in chunks]


@pytest.mark.parametrize("position_headers", [False, True])
def test_route_short_equals_route(position_headers):
    short = ChangeRouter(routes(), db="d", position_headers=position_headers)
    long = ChangeRouter(routes(), db="d", position_headers=position_headers)
    taken = left = 0
    for txn in transactions(3, 400):
        chunk = short.route_short(txn)
        if chunk is None:
            left += 1
            got = list(short.route(txn))
        else:
            taken += 1
            got = [chunk]
        assert summary(got) == summary(long.route(txn)), txn.xid
    assert short.take_dropped() == long.take_dropped() != {}
    # transactions with a truncate went the long way; row changes, filtered or not, did not
    assert taken > 100 and left > 5


def test_route_short_leaves_spilled_and_aborted_changes_to_route():
    router = ChangeRouter(routes(), db="d")
    insert = Change("insert", 1, T, new=("1", "2", "x"))
    for changes in (Changes([insert], [7], None, (), frozenset({9}), 1),):
        txn = Transaction(1, 16, 16, 24, 0, None, None, None, changes, 1)
        assert router.route_short(txn) is None
    assert router.route_short(Transaction(1, 16, 16, 24, 0, None, None, None,
                                          Changes([insert], (), None, (), frozenset(), 1), 1))


def test_route_counts_each_action_a_route_does_not_take():
    """A run of changes of one table recorded the direct way may mix actions: a route that
    takes the table but not updates drops exactly the updates."""
    router = ChangeRouter(routes(), db="d")
    changes = [Change("insert", 1, T, new=("1", "2", "x")),
               Change("update", 2, T, new=("1", "3", "x")),
               Change("update", 3, T, new=("1", "4", "x")),
               Change("insert", 4, T, new=("2", "2", "x"))]
    txn = Transaction(1, 16, 16, 24, 0, None, None, None,
                      Changes(changes, (), None, (), frozenset(), 4), 4)
    records = [r for c in router.route(txn) for r in c.records]
    assert len(records) == 4 + 2  # route "all": every change; route "ins": the inserts
    assert router.take_dropped() == {"ins": 2}
