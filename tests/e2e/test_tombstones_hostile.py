"""Tombstones in the cases that break them, against a broker-compacted topic read by a plain
confluent-kafka consumer (read_committed), in pgrouter's JSON and in Avro under exactly-once:
a table with REPLICA IDENTITY FULL whose deleted rows hold TOASTed values (the delete's old
tuple carries them; its tombstone has the key only), a key change of such a row (the new
row's unchanged TOAST, the old key's tombstone), a key change and a delete of the new key in
one transaction, then a TRUNCATE. What the compacted topic ends with is what
docs/record-formats.md "Tombstones" says: the keys of the rows alive at the TRUNCATE keep
their last records (pgrouter does not know the truncated keys), the rows written after it,
and in JSON one truncate record (key ``null``, the JSON text); every deleted key is gone.
An Avro (or Connect) truncate record has a null Kafka key, which a compacted topic refuses
(INVALID_RECORD, at every start): such a route that publishes TRUNCATE is refused with one
line before anything starts (it stopped the router for good at the first TRUNCATE)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.e2e.test_avro_format import avro_kafka, registry_client
from tests.e2e.test_tombstones import COMPACT, _compacted, _config, _run_all
from tests.helpers import ROOT, Pg, drop_source, router_cmd, unique

pytestmark = pytest.mark.services

BIG = "(select string_agg(md5(g::text || {seed}), '') from generate_series(1, 6000) g)"


def test_toast_key_changes_and_truncate_on_a_compacted_topic(pg_dsn, kafka_bootstrap,
                                                             registry_url, tmp_path):
    pg = Pg(pg_dsn)
    name_json, name_avro = unique("tombh_j"), unique("tombh_a")
    names = (name_json, name_avro)
    for name in names:
        pg.run(f"create table {name} (id int primary key, v text)")
        pg.run(f"alter table {name} replica identity full")
        pg.run(f"create publication {name} for table {name}")
    json_cfg = _config(tmp_path, pg_dsn, kafka_bootstrap, name_json, "", route_extra="")
    avro_kafka_extra = avro_kafka(
        registry_url, f'exactly_once = true\ncommitted_lsn_topic = "{name_avro}.p"\n')
    (tmp_path / "refused").mkdir()
    refused = _config(tmp_path / "refused", pg_dsn, kafka_bootstrap, name_avro,
                      avro_kafka_extra, route_extra="")
    proc = subprocess.run(router_cmd(refused, "--until-caught-up"), capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "a TRUNCATE record has a null key" in proc.stderr.strip().splitlines()[-1]
    avro_cfg = _config(tmp_path, pg_dsn, kafka_bootstrap, name_avro, avro_kafka_extra)
    configs = [json_cfg, avro_cfg]
    try:
        _run_all(configs)  # the slots
        for name in names:
            pg.run(f"insert into {name} select g, 'v' || g from generate_series(1, 20) g")
            for i in (100, 200):  # ~190 kB of hex each: TOASTed out of line
                pg.run(f"insert into {name} values ({i}, {BIG.format(seed=i)})")
            pg.run(f"update {name} set id = 101 where id = 100")  # key change, TOAST kept
            pg.run(f"delete from {name} where id in (101, 200)")  # deletes of TOASTed rows
            pg.run(f"begin; update {name} set id = 50 where id = 5; "
                   f"delete from {name} where id = 50; commit")
            pg.run(f"delete from {name} where id <= 3")
        _run_all(configs)
        alive = {i for (i,) in pg.run(f"select id from {name_json}")}
        assert alive == set(range(4, 21)) - {5}
        for name in names:
            pg.run(f"truncate {name}")
            pg.run(f"insert into {name} values (7, 'after')")
        _run_all(configs)
        time.sleep(0.5)  # past segment.ms: the next record rolls the segment holding them
        for name in names:
            pg.run(f"insert into {name} values (5000, 'roll')")
        _run_all(configs)

        folded = _compacted(kafka_bootstrap, f"{name_json}.t", lambda k: json.loads(k)["id"]
                            if k != b"null" else None)
        # every deleted key gone; the truncated rows' last records stay; one truncate
        assert set(folded) == alive | {None, 5000}
        ops = {k: json.loads(v)["op"] for k, v in folded.items()}
        assert ops[None] == "t" and ops[7] == "c" and ops[4] == "c" and ops[6] == "c"
        assert json.loads(folded[7])["after"]["v"] == "after"

        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext
        deser = AvroDeserializer(registry_client(registry_url))
        topic = f"{name_avro}.t"
        key_ctx = SerializationContext(topic, MessageField.KEY)
        value_ctx = SerializationContext(topic, MessageField.VALUE)
        folded = _compacted(kafka_bootstrap, topic, lambda k: deser(k, key_ctx)["id"])
        assert set(folded) == alive | {5000}  # (truncate not published)
        values = {k: deser(v, value_ctx) for k, v in folded.items()}
        assert values[7]["after"]["v"] == "after" and values[4]["after"]["v"] == "v4"
    finally:
        for name in names:
            drop_source(Pg(pg_dsn), name, kafka_bootstrap,
                        (f"{name}.t", f"{name}.schemas", f"{name}.p"))
        pg.close()


@pytest.mark.parametrize("exactly_once", [False, True])
def test_truncate_into_a_hand_made_compacted_avro_topic_says_what_to_do(
        pg_dsn, kafka_bootstrap, registry_url, tmp_path, exactly_once):
    """A topic made compacted outside pgrouter (the config cannot know it): an Avro TRUNCATE
    record (no key) stops the router with one line naming the topic, the cause and what to
    change (it was librdkafka's bare ``INVALID_RECORD``), and the TRUNCATE is not confirmed."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    pg = Pg(pg_dsn)
    name = unique("tombt")
    topic = f"{name}.t"
    pg.run(f"create table {name} (id int primary key, v text)")
    pg.run(f"create publication {name} for table {name}")
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="t")
    try:
        admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"cleanup.policy": "compact"})])
    finally:
        admin.close()
    extra = f'exactly_once = true\ncommitted_lsn_topic = "{name}.p"\n' if exactly_once else ""
    cfg = _config(tmp_path, pg_dsn, kafka_bootstrap, name, avro_kafka(registry_url, extra),
                  route_extra="")
    cfg.write_text(cfg.read_text().replace(COMPACT, ""))  # compacted by hand only
    try:
        _run_all([cfg])  # the slot
        pg.run(f"insert into {name} values (1, 'a')")
        pg.run(f"truncate {name}")
        proc = subprocess.run(router_cmd(cfg, "--until-caught-up"), capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        last = proc.stderr.strip().splitlines()[-1]
        for part in (f"of topic {topic} as invalid (INVALID_RECORD", "compacted topic",
                     "without a key", "TRUNCATE", 'leave "truncate" out of the operations'):
            assert part in last, last
        assert pg.pending_changes(name, name).endswith("T"), "confirmed past the TRUNCATE"
    finally:
        drop_source(pg, name, kafka_bootstrap, (topic, f"{name}.schemas", f"{name}.p"))
        pg.close()
