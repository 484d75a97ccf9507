"""``tombstones = true`` on a route: a null-value record after each delete (and of the old key
after a key change), so the broker's compaction of a ``cleanup.policy=compact`` topic really
forgets deleted rows. Three routers at once (their compaction waits overlap): pgrouter's JSON
at-least-once, Avro in Kafka transactions (exactly-once), Kafka Connect's JSON. A plain confluent-kafka
consumer folds each compacted topic by key bytes (a null value removes the key): the keys
left are PostgreSQL's rows; ``pgrouter verify`` agrees; ``pgrouter decode`` shows a tombstone
as a null value."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.e2e.test_avro_format import avro_kafka, registry_client
from tests.e2e.test_exactly_once import read_committed
from tests.e2e.verify_stack import stop_router, verify

from tests.helpers import (ROOT, Pg, drop_source, router_cmd, start_router, unique,
                           write_config)

pytestmark = pytest.mark.services

#: the broker's log cleaner looks for work every log.cleaner.backoff.ms (15 s by default)
COMPACTION_DEADLINE = 90
COMPACT = ('topic_settings = { partitions = 1, configs = { "cleanup.policy" = "compact", '
           '"segment.ms" = "200", "min.cleanable.dirty.ratio" = "0.001", '
           '"delete.retention.ms" = "100", "min.compaction.lag.ms" = "0" } }\n')


#: a compacted topic refuses Avro's and Connect's TRUNCATE records (no key:
#: router.formats.tombstones)
NO_TRUNCATE = 'operations = ["insert", "update", "delete"]\n'


def _config(tmp_path, pg_dsn, kafka_bootstrap, name, kafka_extra, route_extra=NO_TRUNCATE):
    return write_config(tmp_path / f"{name}.toml", dsn=pg_dsn, slot=name, publications=[name],
                        bootstrap=kafka_bootstrap,
                        kafka_extra=f'schema_topic = "{name}.schemas"\n{kafka_extra}',
                        routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                               f'topic = "{name}.t"\ntombstones = true\n{route_extra}'
                               f'{COMPACT}')


def _run_all(configs, timeout=120):
    procs = [subprocess.Popen(router_cmd(c, "--until-caught-up"), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in configs]
    for proc in procs:
        _, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-4000:]


def _fold(records) -> dict:
    """key bytes -> value bytes, as a plain consumer of a compacted topic folds it."""
    folded = {}
    for _, key, value in records:
        if value is None:
            folded.pop(key, None)
        else:
            folded[key] = value
    return folded


def _compacted(bootstrap, topic, decode_key) -> dict:
    """The topic folded once the broker's compaction has left one record per key (a deleted
    key's tombstone lingers until delete.retention.ms after its segment was cleaned, and the
    next cleaning of the log)."""
    deadline = time.monotonic() + COMPACTION_DEADLINE
    while True:
        records = read_committed(bootstrap, topic)
        if len(records) == len({key for _, key, _ in records}):
            folded = _fold(records)
            return {decode_key(k): v for k, v in folded.items()}
        assert time.monotonic() < deadline, (
            f"{topic}: not compacted after {COMPACTION_DEADLINE}s ({len(records)} records)")
        time.sleep(2)


def test_tombstones_let_compaction_forget_deleted_rows(pg_dsn, kafka_bootstrap, registry_url,
                                                       tmp_path):
    pg = Pg(pg_dsn)
    name_json, name_avro, name_connect = unique("tomb_j"), unique("tomb_a"), unique("tomb_c")
    names = (name_json, name_avro, name_connect)
    for name in names:
        pg.run(f"create table {name} (id int primary key, v text)")
        pg.run(f"create publication {name} for table {name}")
    json_cfg = _config(tmp_path, pg_dsn, kafka_bootstrap, name_json, "")
    avro_cfg = _config(tmp_path, pg_dsn, kafka_bootstrap, name_avro, avro_kafka(
        registry_url, f'exactly_once = true\ncommitted_lsn_topic = "{name_avro}.p"\n'))
    connect_cfg = _config(tmp_path, pg_dsn, kafka_bootstrap, name_connect, 'format = "connect"')
    configs = [json_cfg, avro_cfg, connect_cfg]
    try:
        _run_all(configs)  # the slots
        for name in names:
            pg.run(f"insert into {name} select g, 'v' || g from generate_series(1, 200) g")
            pg.run(f"update {name} set v = 'w' || id where id % 3 = 0")
            pg.run(f"delete from {name} where id % 2 = 0")
            pg.run(f"update {name} set id = id + 1000 where id in (1, 3, 5)")  # key changes
        _run_all(configs)
        time.sleep(0.5)  # past segment.ms: the next record rolls the segment holding them
        for name in names:
            pg.run(f"insert into {name} values (5000, 'roll')")
        _run_all(configs)
        rows = {i: v for i, v in pg.run(f"select id, v from {name_json}")}
        assert len(rows) == 101
        assert rows == {i: v for i, v in pg.run(f"select id, v from {name_avro}")}

        folded = _compacted(kafka_bootstrap, f"{name_json}.t", lambda k: json.loads(k)["id"])
        assert set(folded) == set(rows), "a deleted key is still in the compacted topic"
        assert {k: json.loads(v)["after"]["v"] for k, v in folded.items()} == rows

        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext
        deser = AvroDeserializer(registry_client(registry_url))
        topic = f"{name_avro}.t"
        key_ctx = SerializationContext(topic, MessageField.KEY)
        value_ctx = SerializationContext(topic, MessageField.VALUE)
        folded = _compacted(kafka_bootstrap, topic, lambda k: deser(k, key_ctx)["id"])
        assert set(folded) == set(rows), "a deleted key is still in the compacted topic"
        assert {k: deser(v, value_ctx)["after"]["v"] for k, v in folded.items()} == rows

        assert rows == {i: v for i, v in pg.run(f"select id, v from {name_connect}")}
        folded = _compacted(kafka_bootstrap, f"{name_connect}.t",
                            lambda k: json.loads(k)["payload"]["id"])
        assert set(folded) == set(rows), "a deleted key is still in the compacted topic"
        assert {k: json.loads(v)["payload"]["after"]["v"] for k, v in folded.items()} == rows

        proc = start_router(json_cfg, tmp_path / "router.log")  # verify waits for its progress
        try:
            status, doc, err = verify(json_cfg)
        finally:
            stop_router(proc)
        assert status == 0, (err, doc)
        shown = subprocess.run([sys.executable, "-m", "actors.cli", "decode", "-c",
                                str(avro_cfg), "--topic", topic], capture_output=True,
                               text=True, timeout=120, cwd=ROOT)
        assert shown.returncode == 0, shown.stderr
        lines = [json.loads(ln) for ln in shown.stdout.splitlines()]
        assert all(ln["key"]["id"] in rows or ln["value"] is None for ln in lines), lines
        # a topic ending with a tombstone still has its newest commit time in status
        pg.run(f"delete from {name_json} where id = 5000")
        _run_all([json_cfg])
        status = subprocess.run([sys.executable, "-m", "actors.cli", "status", "-c",
                                 str(json_cfg), "--json"], capture_output=True, text=True,
                                timeout=120, cwd=ROOT)
        [t] = json.loads(status.stdout)["routes"][name_json]
        assert t["last_commit_time"], t
    finally:
        for name in names:
            drop_source(Pg(pg_dsn), name, kafka_bootstrap,
                        (f"{name}.t", f"{name}.schemas", f"{name}.p"))
        pg.close()
