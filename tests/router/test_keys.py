"""The record key is a table's primary key across every Relation message (``router.routing.keys``):
whatever the replica identity says, one row keeps one key."""

from __future__ import annotations

import json

import pytest

from router.stream.changes import Change
from router.routing.keys import PrimaryKeys
from router.pgoutput import Relation, RelationColumn
from router.routing.change_router import ChangeRouter, RouteSpec

INT4, TEXT = 23, 25


def rel(ident: str, flags: tuple[int, ...], name: str = "t") -> Relation:
    cols = (("id", INT4), ("n", INT4), ("code", TEXT))
    return Relation(7, "public", name, ident,
                    tuple(RelationColumn(f, c, t, -1) for f, (c, t) in zip(flags, cols)))


def flagged(r: Relation) -> list[str]:
    return [c.name for c in r.columns if c.flags & 1]


@pytest.mark.parametrize("ident, flags, known, expected", [
    ("d", (1, 0, 0), {}, ["id"]),                                      # DEFAULT: the primary key
    ("f", (1, 1, 1), {("public", "t"): ("id",)}, ["id"]),              # FULL with a primary key
    ("f", (1, 1, 1), {("public", "t"): ()}, ["id", "n", "code"]),      # FULL without: whole row
    ("i", (1, 1, 0), {("public", "t"): ("id",)}, ["id"]),              # index covering the pk
    ("i", (0, 0, 1), {("public", "t"): ("id",)}, ["id"]),              # index without the pk
    ("i", (0, 0, 1), {("public", "t"): ()}, ["code"]),                 # index, no primary key
    ("n", (0, 0, 0), {("public", "t"): ("id",)}, ["id"]),              # NOTHING with a pk
    ("n", (0, 0, 0), {("public", "t"): ()}, []),                       # NOTHING without: none
])
def test_key_columns_per_replica_identity(ident, flags, known, expected):
    assert flagged(PrimaryKeys(known).keyed(rel(ident, flags))) == expected


def test_default_relation_teaches_the_primary_key():
    keys = PrimaryKeys()
    full = rel("f", (1, 1, 1))
    assert keys.unknown(full)
    keys.keyed(rel("d", (1, 0, 0)))
    assert not keys.unknown(full)
    assert flagged(keys.keyed(full)) == ["id"]
    assert keys.mismatched(rel("i", (0, 0, 1))) == ("id",)
    assert keys.mismatched(rel("i", (1, 0, 1))) is None


class Txn:
    xid, commit_lsn, end_lsn, commit_time = 5, 100, 101, 0
    origin_name = origin_lsn = None
    first_seq, partial = 0, False  # a whole transaction


def route_each(router: ChangeRouter, changes: list) -> list[tuple[bytes, str]]:
    keys = []
    for change in changes:  # one transaction per change, as DDL splits them
        txn = Txn()
        txn.changes = [change]
        for chunk in router.route(txn):
            keys += [(k, json.loads(v)["op"]) for _, k, v, _ in chunk.records]
    return keys


def test_identity_index_without_the_primary_key_keys_only_deletes():
    """USING INDEX on (code): inserts and updates keep the primary key; a DELETE carries
    only the index's columns, so they key it."""
    default, idx = rel("d", (1, 0, 0)), rel("i", (0, 0, 1))
    changes = [Change("insert", 1, default, new=("1", "0", "a")),
               Change("update", 2, idx, new=("1", "1", "a")),
               Change("update", 3, idx, old=(None, None, "a"), old_is_key=True,
                      new=("1", "1", "b")),
               Change("delete", 4, idx, old=(None, None, "b"), old_is_key=True)]
    router = ChangeRouter([RouteSpec(name="r", all_tables=True)], db="d")
    assert route_each(router, changes) == [(b'{"id":1}', "c"), (b'{"id":1}', "u"),
                                           (b'{"id":1}', "u"), (b'{"code":"b"}', "d")]


def test_one_row_keeps_its_key_when_replica_identity_becomes_full():
    """A router that started with the table DEFAULT (no catalog knowledge at all): after the
    Relation message of ``ALTER TABLE … REPLICA IDENTITY FULL`` the key stays ``{"id":1}``,
    for updates and for the delete whose old tuple is the whole row."""
    default, full = rel("d", (1, 0, 0)), rel("f", (1, 1, 1))
    changes = [Change("insert", 1, default, new=("1", "0", "a")),
               Change("update", 2, default, new=("1", "1", "a")),
               Change("update", 3, full, old=("1", "1", "a"), new=("1", "2", "a")),
               Change("update", 4, full, old=("1", "2", "a"), new=("1", "3", "b")),
               Change("delete", 5, full, old=("1", "3", "b"))]

    router = ChangeRouter([RouteSpec(name="r", all_tables=True)], db="d")
    keys = route_each(router, changes)
    assert keys == [(b'{"id":1}', op) for op in "cuuud"]
