"""router.routing.transforms: hash, mask, truncate and null of a route's columns, applied to what
leaves only (filters see PostgreSQL's values), alike in the stream and the snapshot; a
hashed int is published as text; a key column only with transform_keys."""

from __future__ import annotations

import hashlib
import json

import pytest

from router.stream.changes import Change, Changes
from router.config.router import parse_config
from router.formats.envelope import TxContext
from router.errors import ConfigError
from router.pgoutput import UNCHANGED_TOAST, Relation, RelationColumn
from router.routing.change_router import ChangeRouter, RouteSpec
from router.snapshot.rows import SnapshotRows
from router.stream.transactions import Transaction
from router.routing.transforms import ColumnTransform, Salt
from tests.helpers import config_head

INT4, TEXT = 23, 25
REL = Relation(1, "public", "people", "d", (RelationColumn(1, "id", INT4, -1),
                                            RelationColumn(0, "age", INT4, -1),
                                            RelationColumn(0, "email", TEXT, -1),
                                            RelationColumn(0, "name", TEXT, -1),
                                            RelationColumn(0, "note", TEXT, -1)))
SALT = Salt("pepper-é".encode(), "$TEST_SALT")
TRANSFORMS = (ColumnTransform("hash", ("age", "public.people.email"), salt=SALT),
              ColumnTransform("mask", ("name",), chars=3),
              ColumnTransform("truncate", ("other.t.note", "note"), chars=2))


def sha(value: str) -> str:
    return hashlib.sha256("pepper-é".encode() + value.encode()).hexdigest()


def txn(changes):
    return Transaction(5, 100, 100, 101, 789_000_000_000, None, None, None,
                       Changes(changes, (), None, (), frozenset(), len(changes)), len(changes))


def values(records):
    return [(json.loads(k), json.loads(v)) for _, k, v, _ in records]


def test_stream_and_snapshot_carry_the_same_transformed_values():
    def planner(rel):  # the filter reads PostgreSQL's age, not its hash
        return {"insert_filter": lambda row: int(row[1]) > 30}
    router = ChangeRouter([RouteSpec(name="r", planner=planner, transforms=TRANSFORMS)],
                          db="d")
    changes = [Change("insert", 1, REL, new=("1", "42", "a@x.org", "Alice", "long note")),
               Change("insert", 2, REL, new=("2", "20", "b@x.org", "Bob", None)),
               Change("update", 3, REL, new=("1", "43", UNCHANGED_TOAST, "Al", "xy"))]
    chunk = next(iter(router.route(txn(changes))))
    got = values(chunk.records)
    want = {"id": 1, "age": sha("42"), "email": sha("a@x.org"), "name": "***", "note": "lo"}
    assert got[0] == ({"id": 1}, got[0][1]) and got[0][1]["after"] == want
    assert [v["op"] for _, v in got] == ["c", "u"], \
        "the filter saw age 20 (not its hash) and dropped Bob"
    assert got[1][1]["after"] == {"id": 1, "age": sha("43"), "name": "***", "note": "xy"}
    snap = SnapshotRows(ChangeRouter([RouteSpec(name="r", all_tables=True,
                                                transforms=TRANSFORMS)], db="d"))
    tx = TxContext(xid=0, commit_lsn=99, end_lsn=100, commit_time=0)
    rows = snap.chunk(REL, [("1", "42", "a@x.org", "Alice", "long note")], tx, 0).records
    assert values(rows)[0][1]["after"] == want
    [schema] = chunk.schemas
    types = {c.name: c.type for c in schema.columns}
    assert types["age"] == "text" and types["id"] == "int4", "a hashed int is text"
    assert schema.schema_id == snap.router.plans_for(REL)[0].encoder.schema.schema_id


def test_unchanged_toast_and_null_stay_as_they_are():
    router = ChangeRouter([RouteSpec(name="r", all_tables=True, transforms=TRANSFORMS + (
        ColumnTransform("null", ("id",)),))], db="d")
    with pytest.raises(ConfigError, match="transform_keys"):
        router.plans_for(REL)
    router = ChangeRouter([RouteSpec(name="r", all_tables=True, transforms=TRANSFORMS)], db="d")
    change = Change("update", 3, REL, new=("1", None, UNCHANGED_TOAST, None, "xyz"))
    [(_, value)] = values(next(iter(router.route(txn([change])))).records)
    assert value["after"] == {"id": 1, "age": None, "name": None, "note": "xy"}
    assert value["unchanged_toast"] == ["email"]


def test_a_key_transform_needs_transform_keys_and_changes_the_key():
    keyed = (ColumnTransform("hash", ("id",), salt=SALT),)
    router = ChangeRouter([RouteSpec(name="r", all_tables=True, transforms=keyed)], db="d")
    with pytest.raises(ConfigError, match="public.people.id is part of the record key"):
        router.plans_for(REL)
    router = ChangeRouter([RouteSpec(name="r", all_tables=True, transforms=keyed,
                                     transform_keys=True)], db="d")
    change = Change("delete", 3, REL, old=("1", None, None, None, None), old_is_key=True)
    [(key, value)] = values(next(iter(router.route(txn([change])))).records)
    assert key == {"id": sha("1")} and value["before"] == {"id": sha("1")}


def test_the_salt_is_never_shown():
    assert "pepper" not in repr(SALT) and "pepper" not in repr(TRANSFORMS)
    assert "pepper" not in repr(RouteSpec(name="r", transforms=TRANSFORMS))


@pytest.mark.parametrize("entry, problem", [
    ('kind = "hash"\ncolumns = ["a"]', "salt_env"),
    ('kind = "hash"\ncolumns = ["a"]\nsalt = "s"', "salt"),
    ('kind = "hash"\ncolumns = ["a"]\nsalt_env = "A"\nsalt_file = "f"', "exactly one"),
    ('kind = "mask"\ncolumns = ["a"]', "mask needs"),
    ('kind = "truncate"\ncolumns = ["a"]', "chars"),
    ('kind = "rot13"\ncolumns = ["a"]', "one of hash"),
    ('kind = "null"\ncolumns = []', "at least one column"),
])
def test_config_entries_are_checked(entry, problem):
    text = config_head("postgresql://u@h/d") + f"""[[routes]]
name = "r"
all_tables = true
[[routes.transforms]]
{entry}
"""
    with pytest.raises(ConfigError, match=problem):
        parse_config(text)


def test_connect_and_avro_schemas_type_a_hashed_int_as_a_string():
    from router.formats.avro import AvroFormat, SchemasNeeded
    from router.formats.connect import ConnectFormat

    router = ChangeRouter([RouteSpec(name="r", all_tables=True, transforms=TRANSFORMS)], db="d")
    chunk = next(iter(router.route(txn([Change("insert", 1, REL,
                                               new=("1", "42", "e", "n", "x"))]))))
    fmt = ConnectFormat()
    for s in chunk.schemas:
        fmt.learn(s)
    [(_, _, value, _)] = fmt.convert_all(chunk.records)
    doc = json.loads(value)
    after = [f for f in doc["schema"]["fields"] if f["field"] == "after"][0]
    types = {f["field"]: f["type"] for f in after["fields"]}
    assert types["age"] == "string" and types["id"] == "int32"
    assert doc["payload"]["after"]["age"] == sha("42")
    avro = AvroFormat()
    avro.learn(chunk.schemas[0])
    with pytest.raises(SchemasNeeded) as need:
        avro.convert_all(chunk.records)
    [value] = [s for s in need.value.subjects if s.kind == "value"]
    age = value.schema.split('"name":"age"')[1].split("}")[0]
    assert '"string"' in age and '"int"' not in age, age
