"""``[kafka] format = "connect"``: Kafka Connect JSON (schema + payload) as Debezium writes
it, checked against what PostgreSQL itself says the values are."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal

import pytest

from tests.e2e.sources import drop_made, new_table, source_config
from tests.helpers import Pg, run_router, unique
from tests.e2e.test_exactly_once import read_committed

pytestmark = pytest.mark.services

COLUMNS = """id int primary key, amount numeric(10,2), ratio numeric, at timestamp,
             at3 timestamp(3), atz timestamptz, day date, tod time, flag bool, f float8,
             raw bytea, ints int[], tags text[], uid uuid, doc jsonb, big text"""


def unscaled(b64: str) -> int:
    return int.from_bytes(base64.b64decode(b64), "big", signed=True)


@pytest.mark.parametrize("exactly_once", [False, True])
def test_connect_records_carry_debezium_types(pg_dsn, kafka_bootstrap, tmp_path, exactly_once):
    pg, name = new_table(pg_dsn, "cx", f"{COLUMNS}")
    pg.run(f"alter table {name} alter column big set storage external")
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra='client = "librdkafka"\nformat = "connect"\n'
                                    + (f'exactly_once = true\ncommitted_lsn_topic = "{name}.p"\n'
                                       if exactly_once else ""),
                        routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                               f'topic = "{name}"\ntopic_settings = {{ partitions = 1 }}\n')
    try:
        run_router(cfg)
        pg.run(f"""insert into {name} values (1, -12.34, 1.500, '2024-01-02 03:04:05.123456',
                   '2024-01-02 03:04:05.123', '2024-01-02 03:04:05.5+02', '2024-01-02',
                   '13:14:15.25', true, 2.5, '\\x00ff10', '{{1,NULL,3}}', '{{"a b",c}}',
                   'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{"k": [1]}}',
                   repeat('x', 10000))""")
        pg.run(f"update {name} set id = 2, flag = false where id = 1")  # key change, toast kept
        pg.run(f"delete from {name}")
        run_router(cfg)
        records = read_committed(kafka_bootstrap, name)
        assert len(records) == 4, records
        (_, k1, v1), (_, k0, v0), (_, k2, v2), (_, k3, v3) = records
        key, value = json.loads(k1), json.loads(v1)
        assert key["schema"]["type"] == "struct"
        assert key["schema"]["fields"] == [{"type": "int32", "optional": False, "field": "id"}]
        assert key["payload"] == {"id": 1}
        schema, payload = value["schema"], value["payload"]
        assert schema["name"] == f"{name}.Envelope"
        assert [f["field"] for f in schema["fields"]][:5] == ["before", "after", "source", "op",
                                                              "ts_ms"]
        fields = {f["field"]: f for f in schema["fields"][1]["fields"]}
        after = payload["after"]
        assert payload["op"] == "c" and payload["before"] is None
        assert fields["amount"]["name"] == "org.apache.kafka.connect.data.Decimal"
        assert fields["amount"]["parameters"]["scale"] == "2"
        assert Decimal(unscaled(after["amount"])).scaleb(-2) == Decimal("-12.34")
        assert fields["ratio"]["name"] == "io.debezium.data.VariableScaleDecimal"
        assert (Decimal(unscaled(after["ratio"]["value"])).scaleb(-after["ratio"]["scale"])
                == Decimal("1.500"))
        epoch_us = pg.one("select (extract(epoch from timestamp '2024-01-02 03:04:05.123456')"
                          " * 1000000)::bigint")
        assert (fields["at"]["name"], after["at"]) == ("io.debezium.time.MicroTimestamp",
                                                       epoch_us)
        assert (fields["at3"]["name"], after["at3"]) == ("io.debezium.time.Timestamp",
                                                         (epoch_us - 456) // 1000)
        assert fields["atz"]["name"] == "io.debezium.time.ZonedTimestamp"
        assert after["atz"] == "2024-01-02T01:04:05.500000Z"
        assert (fields["day"]["name"], after["day"]) == ("io.debezium.time.Date", 19724)
        assert (fields["tod"]["name"], after["tod"]) == ("io.debezium.time.MicroTime",
                                                         (13 * 3600 + 14 * 60 + 15.25) * 1e6)
        assert (after["flag"], after["f"]) == (True, 2.5)
        assert base64.b64decode(after["raw"]) == b"\x00\xff\x10"
        assert fields["ints"]["items"]["type"] == "int32" and after["ints"] == [1, None, 3]
        assert after["tags"] == ["a b", "c"]
        assert fields["uid"]["name"] == "io.debezium.data.Uuid"
        assert json.loads(after["doc"]) == {"k": [1]}
        assert after["big"] == "x" * 10000
        # the key change: an update with the new key; the unchanged TOAST value as Debezium
        # writes it
        gone = json.loads(v0)["payload"]
        assert json.loads(k0)["payload"] == {"id": 1}
        assert gone["op"] == "d" and gone["before"]["id"] == 1 and gone["after"] is None
        update = json.loads(v2)["payload"]
        assert json.loads(k2)["payload"] == {"id": 2}
        assert update["op"] == "c" and update["after"]["flag"] is False
        assert update["after"]["big"] == "__debezium_unavailable_value"
        assert update["unchanged_toast"] == ["big"]
        delete = json.loads(v3)["payload"]
        assert delete["op"] == "d" and delete["after"] is None
        assert json.loads(k3)["payload"] == {"id": 2}
    finally:
        drop_made(pg, name, if_exists=False)


@pytest.mark.parametrize("fmt", ["json", "connect", "avro", "json+eo", "connect+eo",
                                 "avro+eo"])
def test_one_encoding_for_snapshot_records_and_changes(pg_dsn, kafka_bootstrap, tmp_path, fmt,
                                                       request):
    """A row's initial-snapshot record, its backfill record and its streamed changes carry
    the same key bytes (so the same partition) in the configured format and name one schema:
    the initial snapshot encodes through the same sink reshaping as the stream (it wrote
    pgrouter's own envelope under format "connect"), and every source names built-in types
    alike (the stream named `time[]` `oid:1183`, the snapshot `_time`: two schema ids, and in
    Connect format a string where an array belongs)."""
    from tests.helpers import read_topic
    from tests.e2e.test_backfill import snapshot_cmd

    pg = Pg(pg_dsn)
    name = unique("cxs")
    pg.run(f"create table {name} (id int primary key, v text, day date, days date[], "
           f"tods time[], stamps timestamp[], ivs interval[], pt point)")
    pg.run(f"insert into {name} select g, 'v' || g, date '2024-01-01' + g, "
           f"array[date '2024-01-01' + g, null], array[time '12:00:00', '00:00:01.5'], "
           f"array[timestamp '2024-01-01 00:00:00'], array[interval '1 day'], point(g, 0) "
           f"from generate_series(1, 20) g")
    pg.run(f"create publication {name} for table {name}")
    fmt, _, eo = fmt.partition("+")  # "+eo": the stream and backfills in Kafka transactions
    extra = f'exactly_once = true\ncommitted_lsn_topic = "{name}.p"\n' if eo else ""
    if fmt == "avro":
        registry_url = request.getfixturevalue("registry_url")
        extra += f'[kafka.registry]\nurl = "{registry_url}"\n'
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=f'format = "{fmt}"\n' + extra,
                        routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                               f'topic = "{name}"\ntopic_settings = {{ partitions = 4 }}\n')
    try:
        run_router(cfg)  # the initial snapshot
        pg.run(f"update {name} set v = 'changed' where id <= 20")
        run_router(cfg)
        asked = snapshot_cmd(cfg, name, f"public.{name}")
        assert asked.returncode == 0, asked.stderr
        run_router(cfg)  # the backfill
        if eo:
            # the backfill's last progress record is committed when the run ends (it was
            # left in a Kafka transaction the next start aborted, and the backfill ran again)
            done = [json.loads(v) for _, k, v in read_committed(kafka_bootstrap,
                                                                 "pgrouter.snapshots")
                    if v and json.loads(v).get("slot") == name]
            assert any(p["kind"] == "backfill" and p["state"] == "done" for p in done), done
            # a restart reads the progress topics a Kafka transaction ended (a marker)
            run_router(cfg, timeout=60)
        records = read_topic(kafka_bootstrap, name, decode=fmt != "avro")
        assert len(records) == 60, len(records)
        if fmt == "avro":  # read by confluent-kafka's deserializer, the registry's schemas
            from tests.e2e.test_avro_format import avro_records
            for r, (key, value) in zip(records, avro_records(kafka_bootstrap, name,
                                                             registry_url)):
                r["key"], r["value"] = key, value
        by_key: dict = {}
        schema_ids = set()
        for r in records:
            value = r["value"]
            if fmt == "connect":
                assert set(value) == {"schema", "payload"}, value
                assert set(r["key"]) == {"schema", "payload"}, r["key"]
                value = value["payload"]
                row = value["after"]
                assert row["days"] == [19723 + row["id"], None], row  # 2024-01-01 + id
                assert row["tods"] == [43_200_000_000, 1_500_000], row
                assert row["stamps"] == [1_704_067_200_000_000], row
                assert row["ivs"] == ["1 day"], row
            if fmt == "avro":
                row = value["after"]
                assert row["days"] == [dt.date(2024, 1, 1) + dt.timedelta(row["id"]), None]
                assert row["tods"] == [dt.time(12), dt.time(0, 0, 1, 500000)], row
                assert row["stamps"] == [dt.datetime(2024, 1, 1)], row
                assert row["ivs"] == ["1 day"] and row["pt"] == f"({row['id']},0)", row
            schema_ids.add(value["source"]["schema_id"])
            by_key.setdefault(r["raw"][0], []).append((value["op"], r["partition"]))
        assert len(by_key) == 20, "a row's snapshot record and its change have other keys"
        for ops in by_key.values():
            assert sorted(op for op, _ in ops) == ["r", "r", "u"], ops
            assert len({part for _, part in ops}) == 1, ops
        assert len(schema_ids) == 1, f"one table layout, several schemas: {schema_ids}"
    finally:
        drop_made(pg, name, if_exists=False)
