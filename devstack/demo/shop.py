"""The demo's main job: a small shop schema with publications, the router streaming it,
a mixed workload, and what arrived on each topic (``make demo``)."""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys
import time

import psycopg2

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMA = """
drop schema if exists shop cascade;
drop publication if exists shop_all, big_orders, eu_customers;
create schema shop;
create table shop.customers (id int primary key, name text, country text, email text);
create table shop.orders (id int primary key, customer_id int, amount numeric(10,2),
                          status text, note text);
-- row filters of UPDATE/DELETE publications may use replica-identity columns only
alter table shop.orders replica identity full;
alter table shop.customers replica identity full;
create publication shop_all for table shop.customers, shop.orders;
create publication big_orders for table shop.orders where (amount > 100);
create publication eu_customers for table shop.customers where (country in ('DE', 'FR', 'NL'));
"""
WORKLOAD = [
    "insert into shop.customers values (1, 'Ada', 'DE', 'ada@example.org'), "
    "(2, 'Bo', 'US', 'bo@example.org'), (3, 'Chen', 'FR', 'chen@example.org')",
    "insert into shop.orders values (10, 1, 250.00, 'new', 'gift wrap'), "
    "(11, 2, 20.00, 'new', null), (12, 3, 99.00, 'paid', null)",
    "update shop.orders set amount = 120.00 where id = 12",   # crosses the filter: INSERT
    "update shop.orders set amount = 80.00 where id = 10",    # leaves the filter: DELETE
    "update shop.customers set country = 'NL' where id = 2",  # joins eu_customers
    "delete from shop.orders where id = 11",
    "begin; insert into shop.orders values (13, 1, 500.00, 'new', 'bulk'); "
    "update shop.customers set email = 'ada@new.example.org' where id = 1; commit",
]
#: seconds the demo waits at most for the router's slot (created, then confirmed up to the
#: workload)
WAIT = 60
TOPICS = ["demo.cdc.customers", "demo.cdc.orders", "demo.big_orders", "demo.eu_customers",
          "demo.new_orders", "demo.transactions"]


def _config(info) -> pathlib.Path:
    text = (ROOT / "configs" / "demo.toml").read_text()
    text = text.replace("postgresql://postgres@127.0.0.1:5432/postgres", info.pg_dsn)
    text = text.replace('"127.0.0.1:9092"', json.dumps(info.kafka_bootstrap))
    path = ROOT / ".devstack" / "demo.toml"
    path.write_text(text)
    return path


def _reset(dsn: str) -> int:
    """Fresh schema and slot; returns the WAL position the demo starts at (the topics keep
    earlier runs' records, which the summary leaves out)."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("select pg_drop_replication_slot(slot_name) from pg_replication_slots "
                    "where slot_name = 'pgrouter_demo' and not active")
        cur.execute(SCHEMA)
        cur.execute("select pg_current_wal_lsn() - '0/0'")
        start = int(cur.fetchone()[0])
    conn.close()
    return start


def _drop_slot(dsn: str) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("select pg_drop_replication_slot(slot_name) from pg_replication_slots "
                    "where slot_name = 'pgrouter_demo' and not active")
    conn.close()


def _workload(dsn: str) -> str:
    """Runs the workload; returns the WAL position after its last commit."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        for sql in WORKLOAD:
            print(f"  sql> {sql}")
            cur.execute(sql)
        cur.execute("select pg_current_wal_lsn()::text")
        end = cur.fetchone()[0]
    conn.close()
    return end


def _slot_reaches(dsn: str, router: subprocess.Popen, lsn: str | None) -> bool:
    """Waits (at most ``WAIT`` seconds, while the router runs) until the demo slot exists
    (``lsn`` None) or has confirmed ``lsn``, instead of sleeping a guess long enough on a
    fast machine and too short on a slow one."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    deadline = time.monotonic() + WAIT
    try:
        with conn.cursor() as cur:
            while router.poll() is None and time.monotonic() < deadline:
                cur.execute("select confirmed_flush_lsn >= coalesce(%s::pg_lsn, '0/0') "
                            "from pg_replication_slots where slot_name = 'pgrouter_demo'",
                            (lsn,))
                row = cur.fetchone()
                if row and row[0]:
                    return True
                time.sleep(0.1)
    finally:
        conn.close()
    return False


def _commit_lsn(value: dict) -> int:
    if "op" in value:
        return value["source"]["commit_lsn"] or 0
    return int(value["id"].split(":")[1])  # transaction metadata: "xid:commit_lsn"


def _show(bootstrap: str, start: int) -> None:
    from tests.helpers import read_topic  # the same reader the tests use

    for topic in TOPICS:
        records = [r for r in read_topic(bootstrap, topic, timeout=30)
                   if _commit_lsn(r["value"]) > start]
        print(f"\n== {topic}: {len(records)} record(s)")
        for r in records:
            v = r["value"]
            if "op" not in v:  # transaction metadata
                counts = {d["data_collection"]: d["event_count"]
                          for d in v.get("data_collections") or []}
                print(f"  {v['status']:<5} txn {v['id']}  {counts if counts else ''}")
                continue
            row = v["after"] if v["after"] is not None else v["before"]
            pos = f"{v['source']['commit_lsn']:X}:{v['source']['seq']}"
            print(f"  {v['op']}  key={json.dumps(r['key'])}  {json.dumps(row)}  @{pos}")


def run(info) -> int:
    print("\n1. a shop schema, the slot publication shop_all and two filtered publications")
    start = _reset(info.pg_dsn)
    cfg = _config(info)
    print(f"\n2. the router, streaming slot pgrouter_demo (config {cfg.relative_to(ROOT)})")
    log = ROOT / ".devstack" / "demo-router.log"
    with open(log, "wb") as fh:
        router = subprocess.Popen([sys.executable, "-m", "actors.cli", "run", "-c", str(cfg)],
                                  stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        from devstack.demo import spark_tables as spark_demo
        spark_start = spark_demo.starting_point(info)
    except ImportError:  # pyspark not installed: the demo ends with the topics
        spark_demo = None
    try:
        # the workload once the router's slot exists (changes before it would be missed)
        if not _slot_reaches(info.pg_dsn, router, None):
            print(log.read_text(), file=sys.stderr)
            return 1
        print("\n3. a mixed workload")
        end = _workload(info.pg_dsn)
        # the router confirms a change once Kafka holds it: then SIGTERM loses nothing
        if not _slot_reaches(info.pg_dsn, router, end) and router.poll() is None:
            print(f"   (the router had not confirmed the workload after {WAIT}s; "
                  "stopping it anyway)")
    finally:
        router.send_signal(signal.SIGTERM)  # drain: flush Kafka, confirm, exit 0
        router.wait(timeout=60)
        _drop_slot(info.pg_dsn)  # an idle slot would hold WAL on the user's server for good
    print(f"   router drained and exited {router.returncode} (log: {log.relative_to(ROOT)})")
    print("\n4. what arrived on each topic")
    _show(info.kafka_bootstrap, start)
    if spark_demo is None:
        return router.returncode
    print("\n5. the CDC topics materialized into Delta tables by Spark, next to PostgreSQL")
    return spark_demo.run(info, ROOT, spark_start) or router.returncode
