"""The materializer's Avro reader schemas (``actors.materialize.avro``), from the schemas the
router's Avro writer makes (``router.formats.avro``): what ``from_avro`` reads is the writer's
schema less the logical types Spark cannot hold as the column needs them; renamed fields map back to
their columns; message schemas are skipped; the registry is asked once per id, retried while it
does not answer, and its refusals are one line."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from actors.kafka.registry import RegistryRejected, RegistryUnavailable
from actors.materialize.avro import RegistrySchemas, reader
from actors.materialize.settings import MaterializeError, RegistrySettings
from router.formats.avro import MESSAGE_SCHEMA, AvroFormat, SchemasNeeded
from router.formats.schema import ColumnSchema, TableSchema

AT = SimpleNamespace(topic="t", partition=1, offset=7)


def _value_schema(*columns: ColumnSchema) -> str:
    fmt = AvroFormat()
    fmt.learn(TableSchema(schema_id="s1", schema="public", table="t", columns=columns,
                          key_columns=(columns[0].name,), replica_identity="d"))
    env = {"op": "c", "before": None, "after": {c.name: None for c in columns}, "ts_ms": 1,
           "source": {"db": "d", "schema": "public", "table": "t", "lsn": 1, "commit_lsn": 1,
                      "seq": 0, "schema_id": "s1"}}
    with pytest.raises(SchemasNeeded) as need:
        fmt.convert_all([("topic", None, json.dumps(env).encode(), None)])
    [value] = [s for s in need.value.subjects if s.kind == "value"]
    return value.schema


def _row_fields(text: str) -> dict:
    [before] = [f for f in json.loads(text)["fields"] if f["name"] == "before"]
    return {f["name"]: f["type"][1] for f in before["type"][1]["fields"]}


def test_logical_types_spark_cannot_hold_as_the_column_needs_are_plain():
    text = _value_schema(
        ColumnSchema(name="id", type="int4", type_oid=23, key=True),
        ColumnSchema(name="tm", type="time", type_oid=1083),
        ColumnSchema(name="tm3", type="time", type_oid=1083, precision=3),
        ColumnSchema(name="wide", type="numeric", type_oid=1700, precision=50, scale=2),
        ColumnSchema(name="amount", type="numeric", type_oid=1700, precision=10, scale=2),
        ColumnSchema(name="ts", type="timestamp", type_oid=1114),
        ColumnSchema(name="d", type="date", type_oid=1082))
    written, read = _row_fields(text), _row_fields(reader(text).schema)
    assert written["tm"]["logicalType"] == "time-micros" and "logicalType" not in read["tm"]
    assert written["tm3"]["logicalType"] == "time-millis" and "logicalType" not in read["tm3"]
    assert written["wide"]["logicalType"] == "decimal" and "logicalType" not in read["wide"]
    assert read["wide"]["type"] == "bytes"
    for kept in ("amount", "ts", "d"):
        assert read[kept] == written[kept]
    assert reader(text).columns == {}


def test_fields_named_otherwise_map_back_to_their_columns():
    text = _value_schema(ColumnSchema(name="k 2", type="int4", type_oid=23, key=True),
                         ColumnSchema(name="1st", type="text", type_oid=25),
                         ColumnSchema(name="ok", type="text", type_oid=25))
    assert reader(text).columns == {"k_2": "k 2", "_1st": "1st"}


def test_message_schemas_are_not_read():
    assert reader(json.dumps(MESSAGE_SCHEMA)) is None
    assert reader('"string"') is None


class FakeClient:
    where = "http://registry"

    def __init__(self, answers):
        self.answers = list(answers)
        self.asked = []

    def schema(self, rid):
        self.asked.append(rid)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _schemas(answers):
    slept = []
    schemas = RegistrySchemas(RegistrySettings(url="http://registry"), sleep=slept.append)
    schemas._client = FakeClient(answers)
    return schemas, slept


def test_each_id_is_fetched_once_and_retried_while_the_registry_does_not_answer():
    text = json.dumps(MESSAGE_SCHEMA)
    schemas, slept = _schemas([RegistryUnavailable("down"), RegistryUnavailable("down"), text])
    assert schemas.reader(5, AT) is None and schemas.reader(5, AT) is None
    assert schemas._client.asked == [5, 5, 5] and slept == [1, 2]

    schemas, slept = _schemas([RegistryUnavailable("still down")] * 4)
    with pytest.raises(MaterializeError, match="schema id 5 of the record at t partition 1 "
                                               "offset 7: still down"):
        schemas.reader(5, AT)
    assert slept == [1, 2, 4]


def test_a_refusal_or_no_registry_is_one_line():
    schemas, slept = _schemas([RegistryRejected("schema registry x has no schema with id 5")])
    with pytest.raises(MaterializeError, match="has no schema with id 5") as err:
        schemas.reader(5, AT)
    assert slept == [] and "\n" not in str(err.value)
    with pytest.raises(MaterializeError, match=r"record at t partition 1 offset 7 is Avro "
                                               r"\(Confluent wire format, schema id 5\) and "
                                               r"the config has no \[kafka.registry\]"):
        RegistrySchemas(None).reader(5, AT)
    schemas, _ = _schemas(["{not json"])
    with pytest.raises(MaterializeError, match="schema id 5 of schema registry http://registry "
                                               r"\(named by the record at .*\) is not an Avro "
                                               "schema"):
        schemas.reader(5, AT)
