"""The dev stack's schema registry: confluent-kafka's Avro serializers work against its
Confluent-compatible API end to end through the stack's Kafka, a schema id outlives a
restart of the registry (its storage is the stack's PostgreSQL, not memory), and its port
is never one the stack gave another service."""

from __future__ import annotations

import json
import time
import uuid

import msgspec
import pytest

from devstack import StackInfo, _with_registry_port
from tests.helpers import ROOT


def _schema(name: str, *fields: str) -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "pgrouter.test",
                       "fields": [{"name": "id", "type": "long"},
                                  *({"name": f, "type": ["null", "string"], "default": None}
                                    for f in fields)]})


def _consume_one(bootstrap: str, topic: str, timeout: float = 60):
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                return msg
        raise AssertionError(f"no record on {topic} after {timeout:.0f}s")
    finally:
        consumer.close()


@pytest.mark.services
def test_avro_record_round_trips_through_registry_and_kafka(registry_url, kafka_bootstrap):
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = f"registry-{uuid.uuid4().hex[:8]}"
    schema = _schema("Row", "name")
    client = SchemaRegistryClient({"url": registry_url})
    schema_id = client.register_schema(f"{topic}-value", Schema(schema, "AVRO"))
    assert client.get_latest_version(f"{topic}-value").schema_id == schema_id

    ctx = SerializationContext(topic, MessageField.VALUE)
    record = {"id": 7, "name": "ünïcode"}
    payload = AvroSerializer(client, schema, conf={"auto.register.schemas": False})(record, ctx)
    # Confluent's wire format: magic byte 0, the schema id (4 bytes, big endian), the datum
    assert payload[0] == 0 and int.from_bytes(payload[1:5], "big") == schema_id

    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    producer.produce(topic, key=b"7", value=payload)
    assert producer.flush(60) == 0, "the record was not delivered"
    msg = _consume_one(kafka_bootstrap, topic)
    assert msg.value() == payload
    # a fresh client: the schema comes from the registry, not from the serializer's cache
    reader = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    assert reader(msg.value(), ctx) == record


@pytest.mark.services
def test_a_schema_id_survives_a_registry_restart(devstack):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from devstack import ensure_up, stop_service, status

    subject = f"restart-{uuid.uuid4().hex[:8]}-value"
    schema = Schema(_schema("Before"), "AVRO")
    schema_id = SchemaRegistryClient({"url": devstack.registry_url}).register_schema(
        subject, schema)

    root = ROOT / ".devstack"
    stop_service(root, "registry")
    assert status(root)["registry"]["running"] is False
    info = ensure_up(root)
    assert status(root)["registry"]["running"] is True

    client = SchemaRegistryClient({"url": info.registry_url})
    assert json.loads(client.get_schema(schema_id).schema_str) == json.loads(schema.schema_str)
    assert client.lookup_schema(subject, schema).schema_id == schema_id
    # ids go on from where they were: a memory store would hand out the first ones again
    later = client.register_schema(subject, Schema(_schema("Before", "added"), "AVRO"))
    assert later > schema_id


def test_a_stack_recorded_before_the_registry_has_none():
    old = b'{"pg_dsn":"x","kafka_bootstrap":"y","pg_port":1,"kafka_port":2,"controller_port":3}'
    info = msgspec.json.decode(old, type=StackInfo)
    assert info.registry_port == 0 and info.registry_url == ""


def test_the_registry_takes_a_port_no_other_service_has_and_gives_it_up_unwanted(tmp_path):
    info = StackInfo(pg_dsn="postgresql://postgres@127.0.0.1:8081/postgres",
                     kafka_bootstrap="127.0.0.1:8082", pg_port=8081, kafka_port=8082,
                     controller_port=8083, state_dir=str(tmp_path),
                     extra_pg={"pg2": "postgresql://postgres@127.0.0.1:8084/postgres"})
    wanted = _with_registry_port(tmp_path, info, True)
    assert wanted.registry_port >= 8085
    assert wanted.registry_url == f"http://127.0.0.1:{wanted.registry_port}/apis/ccompat/v7"
    assert _with_registry_port(tmp_path, wanted, True) == wanted  # kept while wanted
    # left out and not running (no pid file in tmp_path): the port is forgotten
    assert _with_registry_port(tmp_path, wanted, False).registry_port == 0
