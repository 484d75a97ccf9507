"""router.connect_format: pgrouter's JSON records → Kafka Connect JSON (pure)."""

from __future__ import annotations

import base64
import json

import pytest

from router.connect_format import ConnectFormat, parse_array
from router.errors import InternalError
from router.schema import ColumnSchema, TableSchema

SCHEMA = TableSchema(schema_id="s1", schema="public", table="t", columns=(
    ColumnSchema(name="id", type="int4", type_oid=23, key=True),
    ColumnSchema(name="amount", type="numeric", type_oid=1700, precision=10, scale=2),
    ColumnSchema(name="note", type="text", type_oid=25)), key_columns=("id",),
    replica_identity="d")


def record(op, before, after, key, **extra):
    source = {"db": "d", "schema": "public", "table": "t", "lsn": 5, "commit_lsn": 9,
              "seq": 0, "schema_id": "s1"}
    value = {"op": op, "before": before, "after": after, "source": source, "ts_ms": 1, **extra}
    return ("topic", None if key is None else json.dumps(key).encode(),
            json.dumps(value).encode(), None)


@pytest.mark.parametrize("text, items", [
    ("{}", []), ("{1,2,3}", ["1", "2", "3"]), ("{NULL,a}", [None, "a"]),
    ('{"a,b","c\\\\d","NULL"}', ["a,b", "c\\d", "NULL"]), ("{{1,2},{3,4}}", ["{1,2}", "{3,4}"]),
    ("[0:1]={7,8}", ["7", "8"]),
])
def test_array_literals(text, items):
    assert parse_array(text) == items


def fmt() -> ConnectFormat:
    f = ConnectFormat()
    f.learn(SCHEMA)
    return f


def test_insert_has_key_and_value_schemas_and_decimal_bytes():
    _, key, value, _ = fmt().convert(record("c", None, {"id": 1, "amount": "-1.50",
                                                        "note": None}, {"id": 1}))
    key, value = json.loads(key), json.loads(value)
    assert key == {"schema": {"type": "struct", "name": "topic.Key", "optional": False,
                              "fields": [{"type": "int32", "optional": False, "field": "id"}]},
                   "payload": {"id": 1}}
    after = value["payload"]["after"]
    assert int.from_bytes(base64.b64decode(after["amount"]), "big", signed=True) == -150
    assert after["note"] is None and value["payload"]["op"] == "c"


def test_key_change_is_a_delete_and_a_create():
    out = fmt().convert_all([record("u", {"id": 1}, {"id": 2, "amount": "1", "note": "x"},
                                    {"id": 2})])
    ops = [(json.loads(k)["payload"], json.loads(v)["payload"]["op"]) for _, k, v, _ in out]
    assert ops == [({"id": 1}, "d"), ({"id": 2}, "c")]


def test_unchanged_toast_is_debeziums_placeholder():
    _, _, value, _ = fmt().convert(record("u", None, {"id": 1, "amount": "2.00"}, {"id": 1},
                                          unchanged_toast=["note"]))
    assert json.loads(value)["payload"]["after"]["note"] == "__debezium_unavailable_value"


def test_truncate_keeps_a_null_key():
    topic, key, value, _ = fmt().convert(record("t", None, None, None))
    assert key is None and json.loads(value)["payload"]["op"] == "t"


def test_records_without_schema_pass_and_unknown_schema_is_a_bug():
    message = ("m", None, b'{"op":"m","source":{"db":"d"}}', None)
    assert fmt().convert(message) == message
    with pytest.raises(InternalError):
        ConnectFormat().convert(record("c", None, {"id": 1}, {"id": 1}))
