"""A sink pgrouter did not write: Kafka Connect standalone with Debezium's JDBC sink
connector consumes the Connect-format topics (``[kafka] format = "connect"``, exactly-once)
into a second PostgreSQL database; after inserts, updates (one changing the key), deletes and
a TRUNCATE, the target table equals the source. A second table's route has
``tombstones = true``: the sink (``delete.enabled=true``, ``primary.key.mode=record_key``)
takes each delete, its tombstone and a key change's old-key tombstone and leaves that target
equal to its source too. Connect is started and stopped here."""

from __future__ import annotations

import json
import time

import psycopg2
import pytest

from devstack.connect import ConnectStandalone
from tests.e2e.guarantee import delete_topics
from tests.e2e.sources import source_config
from tests.e2e.test_exactly_once import read_committed
from tests.helpers import ROOT, Pg, run_router, unique

pytestmark = pytest.mark.services

ROWS = ("select id, amount::text, note, at::text, atz::text, day::text, flag, "
        "encode(raw, 'hex') from {table} order by id")


def rows(dsn: str, table: str):
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(ROWS.format(table=table))
            return cur.fetchall()
    except psycopg2.errors.UndefinedTable:
        return None
    finally:
        conn.close()


def wait_equal(source: str, target: str, table: str, connect: ConnectStandalone,
               timeout: float) -> None:
    deadline = time.monotonic() + timeout
    want = rows(source, table)
    while True:
        got = rows(target, table)
        if got == want:
            return
        assert connect.alive(), connect.log.read_text()[-4000:]
        assert time.monotonic() < deadline, (f"target {got} != source {want}\n"
                                             + connect.log.read_text()[-3000:])
        time.sleep(1)


def test_debezium_jdbc_sink_makes_the_target_equal_the_source(pg_dsn, kafka_bootstrap,
                                                              tmp_path):
    pg = Pg(pg_dsn)
    name = unique("cxsink")
    tomb = f"{name}_tb"  # the same statements on a route with tombstones
    target_db = unique("cxtarget")
    for table in (name, tomb):
        pg.run(f"create table {table} (id int primary key, amount numeric(10,2), note text, "
               "at timestamp, atz timestamptz, day date, flag bool, raw bytea)")
    pg.run(f"create publication {name} for table {name}, {tomb}")
    pg.run(f"create database {target_db}")
    target = pg_dsn.rsplit("/", 1)[0] + f"/{target_db}"
    host_port = pg_dsn.split("@", 1)[1].split("/", 1)[0]
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=f'client = "librdkafka"\nformat = "connect"\n'
                                    f'exactly_once = true\ncommitted_lsn_topic = "{name}.progress"\n',
                        routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                               f'topic = "{name}"\n'
                               f'[[routes]]\nname = "{tomb}"\ntables = ["public.{tomb}"]\n'
                               f'topic = "{tomb}"\ntombstones = true\n')
    connect = ConnectStandalone(ROOT / ".devstack" / "cache", tmp_path / "connect",
                                bootstrap=kafka_bootstrap, topics=[name, tomb],
                                jdbc_url=f"jdbc:postgresql://{host_port}/{target_db}")
    try:
        run_router(cfg)
        for table in (name, tomb):
            pg.run(f"""insert into {table} values
                (1, 1.50, 'a', '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05+02',
                 '2024-01-02', true, '\\x0102'),
                (2, 2.25, 'b', null, null, null, false, null),
                (3, -3.00, 'c', '1999-12-31 23:59:59', null, '1999-12-31', null, '\\x'),
                (4, 4, 'd', null, null, null, null, null)""")
            pg.run(f"update {table} set note = 'bb', amount = 22.5 where id = 2")
            pg.run(f"update {table} set id = 10 where id = 1")  # the key changes
            pg.run(f"delete from {table} where id = 3")
        run_router(cfg)
        connect.start()
        wait_equal(pg_dsn, target, name, connect, timeout=240)
        wait_equal(pg_dsn, target, tomb, connect, timeout=60)
        assert len(rows(target, name)) == 3
        # the sink met tombstones: the delete's and the old key's after the key change
        nulls = [json.loads(k)["payload"]["id"]
                 for _, k, v in read_committed(kafka_bootstrap, tomb) if v is None]
        assert nulls == [1, 3], nulls
        pg.run(f"delete from {tomb} where id in (2, 4)")
        pg.run(f"truncate {name}")
        pg.run(f"insert into {name} (id, note) values (7, 'after truncate')")
        run_router(cfg)
        wait_equal(pg_dsn, target, name, connect, timeout=120)
        wait_equal(pg_dsn, target, tomb, connect, timeout=60)
        assert rows(target, tomb) == [rows(pg_dsn, tomb)[0]] and rows(target, tomb)[0][0] == 10
    finally:
        connect.stop()
        pg.drop_slot(name)
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}, {tomb}")
        delete_topics(kafka_bootstrap, [name, tomb, f"{name}.progress"])
        pg.run(f"drop database if exists {target_db} with (force)")
        pg.close()
