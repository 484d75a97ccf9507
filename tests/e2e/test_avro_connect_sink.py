"""A sink pgrouter did not write, reading Avro: Kafka Connect standalone with Apicurio's
``AvroConverter`` (the Confluent framing, ids from the registry's Confluent-compatible API)
and Debezium's JDBC sink consumes ``[kafka] format = "avro"`` topics (exactly-once) into a
second PostgreSQL database. After inserts of a type corpus, updates (one changing the key),
deletes, an ``ALTER TABLE … ADD COLUMN`` while the router and Connect run (the sink adds the
column) and a TRUNCATE, the target table equals the source, as PostgreSQL prints both.
The router and Connect are started once and stopped here."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import psycopg2
import pytest

from devstack.connect import ConnectStandalone, apicurio_api
from tests.e2e.guarantee import delete_topics
from tests.e2e.sources import source_config
from tests.helpers import ROOT, Pg, kill9, start_router, unique

pytestmark = pytest.mark.services

# name, type, two values (SQL literals); at least what tests/e2e/test_connect_sink.py covers
CORPUS = [
    ("amount", "numeric(10,2)", "1.50", "-12345678.90"),
    # beyond Python's default 28 digits; the sink makes at most numeric(38, s)
    ("wide", "numeric(38,5)", "123456789012345678901234567890123.12345", "-0.00001"),
    ("ratio", "numeric", "-0.001230", "123456789012345678901234567890.5"),
    ("note", "text", "'a'", "'é, \"quoted\"'"),
    ("at", "timestamp", "'2024-01-02 03:04:05.123456'", "'1999-12-31 23:59:59'"),
    ("atz", "timestamptz", "'2024-01-02 03:04:05.5+02'", "'1969-07-20 20:17:40+00'"),
    ("day", "date", "'2024-02-29'", "'1999-12-31'"),
    ("tod", "time", "'13:14:15.25'", "'00:00:00'"),
    ("at3", "timestamp(3)", "'2024-01-02 03:04:05.123'", "'1969-12-31 23:59:59.999'"),
    ("atz3", "timestamptz(3)", "'2024-01-02 03:04:05.123+02'", "'2000-01-01 00:00:00+00'"),
    ("tod3", "time(3)", "'23:59:59.999'", "'00:00:00.001'"),
    ("small", "int2", "-32768", "7"), ("big", "int8", "9223372036854775807", "0"),
    ("f4", "float4", "1.5", "-0.25"),
    ("flag", "bool", "true", "false"),
    ("f8", "float8", "-1.5e300", "0.1"),
    ("raw", "bytea", "'\\x0102'", "'\\x'"),
    ("uid", "uuid", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
     "'00000000-0000-0000-0000-000000000000'"),
    ("doc", "jsonb", "'{\"k\": [1, \"x\"]}'", "'[]'"),
    ("ints", "int[]", "'{1,NULL,3}'", "'{}'"),
]
ADDED = ("extra", "text")
# Columns the sink creates with a type of its own: (the target's column type, the source
# column as that type prints it). Its VariableScaleDecimalType makes unconstrained numeric
# a double ("does not provide adequate information to resolve the precision and scale"), as
# for Debezium's own records; Debezium's sink has no type mapping an int64 to timestamptz
# (only Debezium's ZonedTimestamp string), so timestamptz, a UTC timestamp-micros/-millis
# in pgrouter's Avro, becomes a timestamp holding UTC. Create the target table beforehand
# to keep numeric and timestamptz (docs/record-formats.md).
SINK_TYPES = {"ratio": ("double precision", "ratio::float8::text"),
              "atz": ("timestamp without time zone", "(atz at time zone 'UTC')::text"),
              "atz3": ("timestamp without time zone", "(atz3 at time zone 'UTC')::text")}


def rows(dsn: str, table: str, columns: list[str], *, source: bool):
    """The table's rows as PostgreSQL prints them (None while the table or a column is
    missing); on the source, columns of ``SINK_TYPES`` as the target's type prints them."""
    exprs = [SINK_TYPES[c][1] if source and c in SINK_TYPES else f"{c}::text"
             for c in columns]
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"select id, {', '.join(exprs)} from {table} order by id")
            return cur.fetchall()
    except (psycopg2.errors.UndefinedTable, psycopg2.errors.UndefinedColumn):
        return None
    finally:
        conn.close()


def wait_equal(source: str, target: str, table: str, columns: list[str],
               connect: ConnectStandalone, router, router_log, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    want = rows(source, table, columns, source=True)
    while True:
        got = rows(target, table, columns, source=False)
        if got == want:
            return got
        assert router.poll() is None, router_log.read_text()[-4000:]
        assert connect.alive() and not connect.task_failed(), connect.log.read_text()[-6000:]
        assert time.monotonic() < deadline, (f"target {got} != source {want}\n"
                                             + connect.log.read_text()[-6000:])
        time.sleep(1)


def column_types(dsn: str, table: str) -> dict:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("select column_name, data_type from information_schema.columns "
                        "where table_name = %s", (table,))
            return dict(cur.fetchall())
    finally:
        conn.close()


def delete_subjects(url: str, topic: str) -> None:
    for subject in (f"{topic}-key", f"{topic}-value"):
        for query in ("", "?permanent=true"):
            req = urllib.request.Request(f"{url.rstrip('/')}/subjects/{subject}{query}",
                                         method="DELETE")
            try:
                urllib.request.urlopen(req, timeout=10).close()
            except urllib.error.URLError:
                pass  # not there (the router never registered it)


def insert(name: str, ids: range, pick: int) -> str:
    cols = ", ".join(c for c, _, *_ in CORPUS)
    values = ", ".join(f"({i}, {', '.join(v[pick] for _, _, *v in CORPUS)})" for i in ids)
    return f"insert into {name} (id, {cols}) values {values}"


def test_debezium_jdbc_sink_reads_avro_into_a_target_equal_to_the_source(
        pg_dsn, kafka_bootstrap, registry_url, tmp_path):
    pg = Pg(pg_dsn)
    name = unique("avsink")
    target_db = unique("avtarget")
    columns = [c for c, *_ in CORPUS]
    pg.run(f"create table {name} (id int primary key, "
           + ", ".join(f"{c} {t}" for c, t, *_ in CORPUS) + ")")
    pg.run(f"create publication {name} for table {name}")
    pg.run(f"create database {target_db}")
    target = pg_dsn.rsplit("/", 1)[0] + f"/{target_db}"
    host_port = pg_dsn.split("@", 1)[1].split("/", 1)[0]
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=f'client = "librdkafka"\nformat = "avro"\n'
                                    f'schema_topic = "{name}.schemas"\n'
                                    f'exactly_once = true\ncommitted_lsn_topic = "{name}.progress"\n'
                                    f'[kafka.registry]\nurl = "{registry_url}"\n')
    connect = ConnectStandalone(ROOT / ".devstack" / "cache", tmp_path / "connect",
                                bootstrap=kafka_bootstrap, topics=[name],
                                jdbc_url=f"jdbc:postgresql://{host_port}/{target_db}",
                                registry=apicurio_api(registry_url), name=f"{name}-sink")
    log = tmp_path / "router.log"
    router = start_router(cfg, log)
    try:
        pg.run(insert(name, range(1, 4), 0))
        pg.run(insert(name, range(4, 6), 1))
        pg.run(f"insert into {name} (id) values (6)")  # every column null
        pg.run(f"update {name} set note = 'bb', amount = 22.5, ints = '{{7}}' where id = 2")
        pg.run(f"update {name} set id = 10 where id = 1")  # the key changes
        pg.run(f"delete from {name} where id = 3")
        connect.start()
        got = wait_equal(pg_dsn, target, name, columns, connect, router, log, timeout=240)
        assert [r[0] for r in got] == [2, 4, 5, 6, 10]
        types = column_types(target, name)
        assert {c: types[c] for c in SINK_TYPES} == {c: t for c, (t, _) in SINK_TYPES.items()}

        pg.run(f"alter table {name} add column {ADDED[0]} {ADDED[1]}")
        pg.run(f"insert into {name} (id, note, {ADDED[0]}) values (11, 'added', 'new column')")
        pg.run(f"update {name} set {ADDED[0]} = 'set later' where id = 4")
        got = wait_equal(pg_dsn, target, name, columns + [ADDED[0]], connect, router, log,
                         timeout=120)
        assert got[-1][-1] == "new column"

        pg.run(f"truncate {name}")
        pg.run(f"insert into {name} (id, note, {ADDED[0]}) values (7, 'after truncate', 'x')")
        got = wait_equal(pg_dsn, target, name, columns + [ADDED[0]], connect, router, log,
                         timeout=120)
        assert [r[0] for r in got] == [7]
    finally:
        connect.stop()
        kill9(router)
        pg.drop_slot(name)
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}")
        pg.run(f"drop database if exists {target_db} with (force)")
        delete_subjects(registry_url, name)
        delete_topics(kafka_bootstrap, [name, f"{name}.schemas", f"{name}.progress"])
        pg.close()
