"""``pgrouter verify`` on topics in Kafka Connect's JSON and in Avro (schema registry): equal
while a writer writes (every type of the formats' tables, a key change, an unchanged TOAST
value), then a record left out of the middle of the topic is named, and records written twice
change nothing. A table of the types whose bucket digests both sides compute alike in these
formats (ints, text, floats with NaN and ±Infinity, bool, uuid, jsonb, interval, char(n)) is
found equal by its digests alone, then a record left out of its topic is named."""

from __future__ import annotations

import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.verify_stack import Router, Writer, result, rewrite_topic, verify, wait_for
from tests.helpers import Pg, unique, write_config

pytestmark = pytest.mark.services

ROWS = 300


@pytest.mark.parametrize("fmt", ["connect", "avro"])
def test_verify_reads_every_format(fmt, pg_dsn, kafka_bootstrap, registry_url, tmp_path):
    pg = Pg(pg_dsn)
    u = unique(f"vf{fmt[0]}")
    t = f"t_{u}"
    pg.run(f"create type mood_{u} as enum ('sad', 'ok')")
    pg.run(f"create table {t}(id int primary key, n int, v text, num numeric(12,3), "
           "num_any numeric, ts timestamp default '2026-03-01 12:00:00.123456', "
           "tstz timestamptz default '2026-03-01 12:00:00.5+02', d date default '2026-02-28', "
           "tm time default '13:14:15.5', j jsonb default '{\"a\": [1, 2.5]}', "
           "b bytea default '\\x00ff', arr text[] default '{x,\"y z\",NULL}', "
           "ints int[] default '{1,2}', f4 float4 default 1.5, f8 float8 default 'NaN', "
           f"flag bool default true, m mood_{u} default 'ok', "
           "uid uuid default 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', "
           "iv interval default '1 day 02:03:04', big text)")
    pg.run(f"insert into {t}(id, n, v, num, num_any) select g, g, 'v' || g, g / 7.0, g / 3.0 "
           f"from generate_series(1, {ROWS}) g")
    pg.run(f"update {t} set big = (select string_agg(md5(random()::text), '') from "
           "generate_series(1, 200)) where id = 10")
    # a table of the types whose digests both sides compute alike in these formats
    s = f"s_{u}"
    pg.run(f"create table {s}(id int primary key, n int, v text, f4 float4 default 1.1, "
           "f8 float8 default 'NaN', f8b float8 default 0.1, flag bool default true, "
           "uid uuid default 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', "
           "j jsonb default '{\"a\": [1, 2.5]}', iv interval default '1 day 02:03:04', "
           "c char(5) default 'ab', i8 int8 default 9000000000, e text default 'é\t\"')")
    pg.run(f"insert into {s}(id, n, v) select g, g, 'v' || g from generate_series(1, {ROWS}) g")
    pg.run(f"update {s} set v = null, f4 = '-Infinity', f8b = 1e300 where id = 3")
    pg.run(f"create publication p_{u} for table {t}, {s}")
    slot = f"{u}_router"
    kafka = f'format = "{fmt}"\n'
    if fmt == "avro":
        kafka += f'\n[kafka.registry]\nurl = "{registry_url}"\n'
    cfg = write_config(tmp_path / "router.toml", dsn=pg_dsn, slot=slot,
                       publications=[f"p_{u}"], bootstrap=kafka_bootstrap, kafka_extra=kafka,
                       routes=f'[[routes]]\nname = "r_{u}"\ntables = ["{t}"]\n'
                              f'[[routes]]\nname = "s_{u}"\ntables = ["{s}"]\n')
    router = Router(cfg, tmp_path / "router.log")
    writer = Writer(pg_dsn, t, ROWS + 50, low=20)
    topic, stopic = f"r_{u}.public.{t}", f"s_{u}.public.{s}"
    try:
        wait_for("the slot", lambda: pg.run("select 1 from pg_replication_slots where "
                                            "slot_name = %s and active", slot), router.log)
        pg.run(f"update {t} set n = -1 where id = 10")  # big: unchanged TOAST
        pg.run(f"update {t} set id = 100000 where id = 11")  # a key change
        writer.start()
        code, doc, err = verify(cfg)
        assert code == 0, (err, doc)
        r = result(doc, f"r_{u}")
        assert r["compared"] > ROWS / 2 and r["matching"] == r["compared"] and writer.ops > 0
        # the plain table by its bucket digests alone: no row read one by one
        rs = result(doc, f"s_{u}")
        assert rs["compared"] == ROWS and rs["buckets"] >= 1 and rs["rows_read"] == 0, rs
        writer.halt()

        def damage(records):
            # the first record of key 7 left out; every record of key 8 written twice
            first7 = next(i for i, rec in enumerate(records)
                          if _key_id(rec[1], fmt, registry_url) == 7)
            twice = [rec for rec in records if _key_id(rec[1], fmt, registry_url) == 8]
            return records[:first7] + records[first7 + 1:] + twice

        ids = set(pg.run(f"select id from {t} where id in (7, 8)"))
        rewrite_topic(kafka_bootstrap, topic, damage)
        rewrite_topic(kafka_bootstrap, stopic, lambda records: [
            rec for rec in records if _key_id(rec[1], fmt, registry_url) != 7])
        code, doc, err = verify(cfg)
        assert code == 1, (err, doc)
        rs = result(doc, f"s_{u}")
        assert rs["missing_keys"] == [{"id": 7}] and rs["buckets_differing"] == 1, rs
        assert (rs["missing"], rs["extra"], rs["different"]) == (1, 0, 0), rs
        r = result(doc, f"r_{u}")
        # key 7's one record (the writer leaves keys below 20 alone) is gone; key 8's
        # records written twice change nothing
        assert ids == {(7,), (8,)}
        assert (r["missing"], r["extra"], r["different"]) == (1, 0, 0), r
        assert r["missing_keys"] == [{"id": 7}]
        # in passes of at most 120 keys: the same finding
        code, doc, err = verify(cfg, "--max-keys", "120")
        r = result(doc, f"r_{u}")
        assert code == 1 and r["passes"] >= 2 and r["missing_keys"] == [{"id": 7}], (err, r)
        assert r["missing"] == 1 and r["extra"] == r["different"] == 0, r
        if fmt == "connect":
            # a deleted topic, then a router stopped behind the verify point: one line each
            delete_topics(kafka_bootstrap, [topic])
            code, doc, err = verify(cfg)
            assert code == 2 and doc is None and f"topic '{topic}' does not exist" in err, err
            router.stop()
            pg.run(f"update {t} set n = 0 where id = 1")
            code, doc, err = verify(cfg)
            assert code == 2 and "the router is not running" in err, err
            assert len(err.strip().splitlines()) == 2, err  # the snapshot line, the error
    finally:
        writer.halt()
        router.stop()
        pg.drop_slot(slot)
        pg.run(f"drop publication if exists p_{u}")
        pg.run(f"drop table if exists {t}, {s}")
        pg.run(f"drop type if exists mood_{u}")
        delete_topics(kafka_bootstrap, [topic, stopic])
        pg.close()


def _key_id(key: bytes | None, fmt: str, registry_url: str):
    import json

    if key is None:
        return None
    if fmt == "connect":
        return json.loads(key)["payload"]["id"]
    return _avro_key(key, registry_url)


_READERS: dict = {}


def _avro_key(key: bytes, url: str):
    from actors.kafka.registry import AvroDecoder, RegistryClient
    from router.config.router import RegistryConfig

    if url not in _READERS:
        _READERS[url] = AvroDecoder(RegistryClient(RegistryConfig(url=url)))
    return _READERS[url].key(key)["id"]
