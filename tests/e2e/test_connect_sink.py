"""A sink pgrouter did not write: Kafka Connect standalone with Debezium's JDBC sink
connector consumes the Connect-format topics (``[kafka] format = "connect"``, exactly-once)
into a second PostgreSQL database; after inserts, updates (one changing the key), deletes and
a TRUNCATE, the target table equals the source. Connect is started and stopped here."""

from __future__ import annotations

import time

import psycopg2
import pytest

from devstack.connect import ConnectStandalone
from tests.helpers import ROOT, Pg, run_router, unique, write_config

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
    target_db = unique("cxtarget")
    pg.run(f"create table {name} (id int primary key, amount numeric(10,2), note text, "
           "at timestamp, atz timestamptz, day date, flag bool, raw bytea)")
    pg.run(f"create publication {name} for table {name}")
    pg.run(f"create database {target_db}")
    target = pg_dsn.rsplit("/", 1)[0] + f"/{target_db}"
    host_port = pg_dsn.split("@", 1)[1].split("/", 1)[0]
    cfg = write_config(tmp_path / "r.toml", dsn=pg_dsn, slot=name, publications=[name],
                       bootstrap=kafka_bootstrap,
                       kafka_extra=f'client = "librdkafka"\nformat = "connect"\n'
                                   f'exactly_once = true\ncommitted_lsn_topic = "{name}.progress"\n',
                       routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                              f'topic = "{name}"\n')
    connect = ConnectStandalone(ROOT / ".devstack" / "cache", tmp_path / "connect",
                                bootstrap=kafka_bootstrap, topics=[name],
                                jdbc_url=f"jdbc:postgresql://{host_port}/{target_db}")
    try:
        run_router(cfg)
        pg.run(f"""insert into {name} values
            (1, 1.50, 'a', '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05+02',
             '2024-01-02', true, '\\x0102'),
            (2, 2.25, 'b', null, null, null, false, null),
            (3, -3.00, 'c', '1999-12-31 23:59:59', null, '1999-12-31', null, '\\x')""")
        pg.run(f"update {name} set note = 'bb', amount = 22.5 where id = 2")
        pg.run(f"update {name} set id = 10 where id = 1")  # the key changes
        pg.run(f"delete from {name} where id = 3")
        run_router(cfg)
        connect.start()
        wait_equal(pg_dsn, target, name, connect, timeout=240)
        assert len(rows(target, name)) == 2
        pg.run(f"truncate {name}")
        pg.run(f"insert into {name} (id, note) values (7, 'after truncate')")
        run_router(cfg)
        wait_equal(pg_dsn, target, name, connect, timeout=120)
    finally:
        connect.stop()
        pg.drop_slot(name)
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}")
        pg.run(f"drop database if exists {target_db} with (force)")
        pg.close()
