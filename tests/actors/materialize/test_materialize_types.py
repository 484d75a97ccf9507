"""Pure parts of the materializer: PostgreSQL -> Spark type mapping, array literals, paths.
No JVM: these run without starting Spark."""

from __future__ import annotations

import json

import msgspec
import pytest

from actors.materialize.columns import (image_fields, parse_pg_array, quote, spark_type_name,
                                        table_path, widens)
from router.formats.envelope import TableEncoder, TxContext
from router.pgoutput import Relation, RelationColumn
from router.formats.schema import encode_schema, table_schema

NUM = lambda p, s: ((p << 16) | (s & 0x7FF)) + 4  # noqa: E731 - numeric(p,s) typmod


@pytest.mark.parametrize("oid,typmod,expected", [
    (21, -1, "smallint"), (23, -1, "int"), (20, -1, "bigint"), (26, -1, "bigint"),
    (1700, NUM(12, 2), "decimal(12,2)"), (1700, NUM(38, 0), "decimal(38,0)"),
    (1700, -1, "string"),              # unconstrained: only text is lossless
    (1700, NUM(39, 2), "string"),      # wider than Spark's 38 digits
    (1700, NUM(5, -2), "decimal(7,0)"),  # negative scale: whole numbers, two more digits
    (1700, NUM(3, 5), "decimal(5,5)"),   # scale > precision (PG 15)
    (700, -1, "float"), (701, -1, "double"), (16, -1, "boolean"),
    (25, -1, "string"), (1043, 14, "string"), (1042, 9, "string"), (19, -1, "string"),
    (1082, -1, "date"), (1114, -1, "timestamp_ntz"), (1184, -1, "timestamp"),
    (1114, 3, "timestamp_ntz"), (1083, -1, "string"), (2950, -1, "string"),
    (114, -1, "string"), (3802, -1, "string"), (1186, -1, "string"), (17, -1, "binary"),
    (1007, -1, "array<int>"), (1016, -1, "array<bigint>"), (1009, -1, "array<string>"),
    (1231, -1, "array<string>"), (1022, -1, "array<double>"), (1000, -1, "array<boolean>"),
    (1182, -1, "array<date>"), (1185, -1, "array<timestamp>"), (1001, -1, "string"),
    (869, -1, "string"), (99999, -1, "string"),  # unknown types stay text
])
def test_spark_type_from_schema_topic(oid, typmod, expected):
    rel = Relation(1, "s", "t", "d", (RelationColumn(0, "c", oid, typmod),))
    col = table_schema(rel).columns[0]
    # the job reads the schema topic's JSON, where default fields are left out
    assert spark_type_name(json.loads(msgspec.json.encode(col))) == expected


@pytest.mark.parametrize("text,expected", [
    ("{}", []),
    ("{1,2,3}", ["1", "2", "3"]),
    ("{1,NULL,-3}", ["1", None, "-3"]),
    ('{"a b",NULL,"NULL",c}', ["a b", None, "NULL", "c"]),
    ('{"x\\"y","back\\\\slash","{,}"}', ['x"y', "back\\slash", "{,}"]),
    ('{"2024-01-02 03:04:05+00"}', ["2024-01-02 03:04:05+00"]),
    ("[0:1]={7,8}", ["7", "8"]),
    (None, None),
])
def test_parse_pg_array(text, expected):
    assert parse_pg_array(text) == expected


@pytest.mark.parametrize("text", ["{{1,2},{3,4}}", "1,2", ""])
def test_parse_pg_array_rejects(text):
    with pytest.raises(ValueError):
        parse_pg_array(text)


def test_table_path_and_quote():
    assert table_path("/wh/", "orders", "public", "t") == "/wh/orders/public/t"
    assert table_path("s3://b/wh", "a/b", "s", "t") == "s3://b/wh/a_b/s/t"
    assert quote("we`ird") == "`we``ird`"


@pytest.mark.parametrize("old,new,ok", [
    ("smallint", "int", True), ("int", "bigint", True), ("smallint", "bigint", True),
    ("bigint", "int", False), ("int", "string", False), ("string", "int", False),
    ("float", "double", True), ("double", "float", False), ("date", "timestamp_ntz", True),
    ("decimal(10,2)", "decimal(12,2)", True), ("decimal(10,2)", "decimal(12,4)", True),
    ("decimal(10,2)", "decimal(10,3)", False), ("decimal(12,2)", "decimal(10,2)", False),
    ("int", "decimal(12,2)", True), ("int", "decimal(10,2)", False),
    ("bigint", "decimal(20,0)", True), ("decimal(12,2)", "string", False),
    ("string", "string", True),
])
def test_type_widening(old, new, ok):
    """int -> bigint and the like widen a Delta column in place; anything else is refused."""
    assert widens(old, new) is ok


# one column per kind of value: (type OID, PostgreSQL's text form of a value)
_VALUES = [(23, "-8"), (21, "7"), (20, "9007199254740993"), (26, "4294967295"), (16, "t"),
           (16, "f"), (700, "NaN"), (701, "1.5"), (1700, "1.50"), (25, "12"), (1043, "x"),
           (1007, "{1,2}"), (1184, "2024-01-01 00:00:00+00"), (17, "\\x00"), (3802, "{}")]


def test_typed_image_fields_are_what_the_encoder_writes():
    """The job parses a column as a number or boolean only when the router always writes its
    values so (a string there would stop the job): checked against the encoder itself."""
    rel = Relation(1, "public", "t", "d", tuple(
        RelationColumn(1 if i == 0 else 0, f"c{i}", oid, -1) for i, (oid, _) in enumerate(_VALUES)))
    enc = TableEncoder(rel, route="r", db="postgres")
    kinds = dict(image_fields([json.loads(encode_schema(enc.schema)[1])]))
    tx = TxContext(xid=1, commit_lsn=16, end_lsn=17, commit_time=0)
    after = json.loads(enc.encode("c", tx, 16, 0, old=None, old_is_key=False,
                                  new=tuple(v for _, v in _VALUES))[1])["after"]
    for name, kind in kinds.items():
        assert type(after[name]) is {"bigint": int, "boolean": bool}.get(kind, type(after[name]))
    assert {n for n, k in kinds.items() if k != "string"} == {"c0", "c1", "c2", "c3", "c4", "c5"}
    assert {kinds["c0"], kinds["c4"], kinds["c7"]} == {"bigint", "boolean", "string"}


def test_image_fields_fall_back_to_text_when_tables_disagree():
    one = {"columns": [{"name": "id", "type_oid": 23}, {"name": "ok", "type_oid": 16}]}
    two = {"columns": [{"name": "id", "type_oid": 25}, {"name": "ok", "type_oid": 16},
                       {"name": "n", "type_oid": 20}]}
    old = {"columns": [{"name": "n"}]}  # a schema without type OIDs: text
    assert image_fields([one, two]) == (("id", "string"), ("n", "bigint"), ("ok", "boolean"))
    assert image_fields([two, old]) == (("id", "string"), ("n", "string"), ("ok", "boolean"))
