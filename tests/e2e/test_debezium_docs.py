"""docs/debezium.md's route examples run as the page shows them: its ``[[routes]]`` TOML blocks,
taken from the page, are the routes of a router on a database of the test's own (so the
page's ``public.outbox`` and ``public.customers`` are the tables it names). Only the route
names get the test's suffix (their topics are ``{route}.{schema}.{table}``) and the events'
aggregate type is the test's own. Checked with a plain consumer: the outbox event in
Debezium's shape on ``outbox.event.<aggregatetype>``; the customers' email hashed as
PostgreSQL computes it, name masked, note truncated, a tombstone after the delete."""

from __future__ import annotations

import json
import re

import pytest

from router.config.router import parse_config
from tests.e2e.guarantee import delete_topics
from tests.helpers import ROOT, Pg, database_dsn, read_topic, run_router, unique, write_config

pytestmark = pytest.mark.services

SALT = "pepper-ß"


def route_blocks() -> list[str]:
    text = (ROOT / "docs" / "debezium.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    routes = [b for b in blocks if b.lstrip().startswith("[[routes]]")]
    assert len(routes) == 2, "docs/debezium.md shows an outbox route and a transforms route"
    return routes


def test_the_debezium_pages_examples_run(pg_dsn, kafka_bootstrap, tmp_path, monkeypatch):
    admin = Pg(pg_dsn)
    name = unique("dbzdoc")
    admin.run(f"create database {name}")
    dsn = database_dsn(pg_dsn, name)
    pg = Pg(dsn)
    kind = f"Order_{name[-8:]}"
    routes = "\n".join(re.sub(r'^name = "(\w+)"', rf'name = "\1_{name}"', b, flags=re.M)
                       for b in route_blocks())
    outbox_route, crm_route = f"outbox_{name}", f"crm_{name}"
    topics = [f"outbox.event.{kind}", f"{crm_route}.public.customers"]
    monkeypatch.setenv("PGROUTER_HASH_SALT", SALT)
    try:
        pg.run("create table outbox (id uuid primary key default gen_random_uuid(), "
               "aggregatetype varchar(255) not null, aggregateid varchar(255) not null, "
               "type varchar(255) not null, payload jsonb)")
        pg.run("create table customers (id int primary key, email text, name text, note text)")
        pg.run("insert into customers values (1, 'a@example.com', 'Alice', 'first'), "
               "(2, 'b@example.com', 'Bob', 'second')")
        pg.run(f"create publication {name} for table outbox, customers")
        cfg = write_config(tmp_path / "r.toml", dsn=dsn, slot=name, publications=[name],
                           bootstrap=kafka_bootstrap,
                           kafka_extra=f'schema_topic = "{name}.schemas"\n', routes=routes)
        parse_config(cfg.read_text(), source=str(cfg))
        run_router(cfg)  # the slot; the customers snapshot
        with pg.conn.cursor() as cur:
            pg.conn.autocommit = False
            cur.execute("update customers set note = 'changed' where id = 1")
            cur.execute("insert into outbox (aggregatetype, aggregateid, type, payload) values "
                        "(%s, '1', 'CustomerChanged', '{\"id\": 1}') returning id", (kind,))
            event = str(cur.fetchone()[0])
            cur.execute("delete from outbox")
            pg.conn.commit()
            pg.conn.autocommit = True
        pg.run("delete from customers where id = 2")
        run_router(cfg)

        [ev] = read_topic(kafka_bootstrap, topics[0], decode=False, settle=0)
        assert ev["raw"] == (b"1", b'{"id": 1}')
        assert ev["headers"]["id"] == event.encode()
        assert ev["headers"]["type"] == b"CustomerChanged"

        records = read_topic(kafka_bootstrap, topics[1], decode=False, settle=0)
        assert [json.loads(r["raw"][1])["op"] if r["raw"][1] else None for r in records] == [
            "r", "r", "u", "d", None]
        assert records[-1]["raw"][0] == records[-2]["raw"][0]  # the tombstone of the delete
        after = json.loads(records[2]["raw"][1])["after"]
        digest = pg.one("select encode(sha256(convert_to(%s || 'a@example.com', 'UTF8')), "
                        "'hex')", SALT)
        assert after == {"id": 1, "email": digest, "name": "****", "note": "cha"}
        first = [json.loads(r["raw"][1])["after"] for r in records[:2]]
        assert [r["note"] for r in first] == ["fir", "sec"]
        for r in records:
            assert SALT.encode() not in (r["raw"][1] or b"")
        assert outbox_route in routes and crm_route in routes
    finally:
        pg.conn.autocommit = True
        pg.drop_slot(name)
        pg.close()
        admin.run(f"drop database if exists {name} with (force)")
        admin.close()
        delete_topics(kafka_bootstrap, topics + [f"{name}.schemas"])
