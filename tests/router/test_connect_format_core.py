"""router.formats.connect: pgrouter's JSON records → Kafka Connect JSON (pure)."""

from __future__ import annotations

import base64
import json

import pytest

from router.formats.connect import ConnectFormat
from router.formats.connect_values import parse_array
from router.errors import InternalError, RecordUnencodable
from router.formats.schema import ColumnSchema, TableSchema, column_schema

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


def test_decimals_beyond_28_digits_are_exact():
    wide = TableSchema(schema_id="s1", schema="public", table="t", columns=(
        ColumnSchema(name="id", type="int4", type_oid=23, key=True),
        ColumnSchema(name="n", type="numeric", type_oid=1700, precision=40, scale=5),
        ColumnSchema(name="v", type="numeric", type_oid=1700)), key_columns=("id",),
        replica_identity="d")
    f = ConnectFormat()
    f.learn(wide)
    after = {"id": 1, "n": "12345678901234567890123456789012345.12345",
             "v": "-123456789012345678901234567890.5"}
    _, _, value, _ = f.convert(record("c", None, after, {"id": 1}))
    after = json.loads(value)["payload"]["after"]
    assert int.from_bytes(base64.b64decode(after["n"]), "big", signed=True) == \
        1234567890123456789012345678901234512345
    assert after["v"]["scale"] == 1 and int.from_bytes(
        base64.b64decode(after["v"]["value"]), "big", signed=True) == \
        -1234567890123456789012345678905


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


def array_format(oid: int) -> ConnectFormat:
    """A table (id int4, a <array type oid>) named as the stream names it (built-in OIDs)."""
    cols = (column_schema("id", 23, -1, True), column_schema("a", oid, -1, False))
    f = ConnectFormat()
    f.learn(TableSchema(schema_id="s1", schema="public", table="t", columns=cols,
                        key_columns=("id",), replica_identity="d"))
    return f


@pytest.mark.parametrize("oid, text, items, item_schema", [
    (1182, "{2024-01-01,NULL,1970-01-02}", [19723, None, 1],
     {"type": "int32", "name": "io.debezium.time.Date"}),
    (1115, '{"2024-01-01 00:00:00","1970-01-01 00:00:01.5"}', [1704067200000000, 1500000],
     {"type": "int64", "name": "io.debezium.time.MicroTimestamp"}),
    (1185, '{"2024-01-01 02:00:00+02"}', ["2024-01-01T00:00:00Z"],
     {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}),
    (1183, "{12:00:00,00:00:01.25}", [43200000000, 1250000],
     {"type": "int64", "name": "io.debezium.time.MicroTime"}),
    (1187, '{"1 day","00:00:05"}', ["1 day", "00:00:05"], {"type": "string"}),
    (1000, "{t,f,NULL}", [True, False, None], {"type": "boolean"}),
    (1007, "{1,-2}", [1, -2], {"type": "int32"}),
    (1009, "{{a,b},{c,d}}", ["{a,b}", "{c,d}"], {"type": "string"}),
])
def test_arrays_of_every_builtin_type_map_their_elements(oid, text, items, item_schema):
    _, _, value, _ = array_format(oid).convert(record("c", None, {"id": 1, "a": text},
                                                      {"id": 1}))
    value = json.loads(value)
    assert value["payload"]["after"]["a"] == items
    row = next(f for f in value["schema"]["fields"] if f["field"] == "after")
    field = next(f for f in row["fields"] if f["field"] == "a")
    assert field["type"] == "array"
    assert {k: field["items"][k] for k in item_schema} == item_schema


@pytest.mark.parametrize("oid, text", [(1007, "{{1,2},{3,4}}"), (1182, "{{2024-01-01}}"),
                                       (1183, "{{12:00:00}}")])
def test_a_multidimensional_array_without_connect_form_is_one_line_naming_the_column(oid,
                                                                                     text):
    with pytest.raises(RecordUnencodable) as info:
        array_format(oid).convert(record("c", None, {"id": 1, "a": text}, {"id": 1}))
    message = str(info.value)
    assert "public.t" in message and "'a'" in message and text in message
    assert "multi-dimensional" in message
