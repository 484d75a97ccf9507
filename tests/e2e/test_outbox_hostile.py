"""Outbox rows a hostile application writes, against real PostgreSQL and Kafka, read by a
plain confluent-kafka consumer: a ``bytea`` payload is published as its bytes; a row whose
topic column is NULL stops the router with one line naming the column and the event id, and
nothing past the events delivered is confirmed (the row is still in the slot)."""

from __future__ import annotations

import subprocess

import pytest

from tests.e2e.guarantee import delete_topics
from tests.helpers import ROOT, Pg, read_topic, router_cmd, run_router, unique, write_config

pytestmark = pytest.mark.services


def test_bytea_payload_and_a_null_topic_column(pg_dsn, kafka_bootstrap, tmp_path):
    pg = Pg(pg_dsn)
    name = unique("obxh")
    topic = f"{name}.Order"
    pg.run(f"create table {name} (id serial primary key, aggregatetype text, "
           "aggregateid text, payload bytea)")
    pg.run(f"alter table {name} replica identity full")
    pg.run(f"create publication {name} for table {name}")
    cfg = write_config(tmp_path / "r.toml", dsn=pg_dsn, slot=name, publications=[name],
                       bootstrap=kafka_bootstrap,
                       routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                              f'[routes.outbox]\ntopic = "{name}.{{aggregatetype}}"\n')
    try:
        run_router(cfg, timeout=300)
        pg.run(f"insert into {name} (aggregatetype, aggregateid, payload) "
               "values ('Order', 'o-1', '\\x00ff41'::bytea)")
        pg.run(f"update {name} set payload = '\\x01'::bytea")  # no event
        run_router(cfg)
        [event] = read_topic(kafka_bootstrap, topic, decode=False)
        assert event["raw"] == (b"o-1", b"\x00\xffA")
        assert event["headers"]["id"] == b"1"
        pg.run(f"insert into {name} (aggregatetype, aggregateid, payload) "
               "values (null, 'o-2', 'x')")
        proc = subprocess.run(router_cmd(cfg, "--until-caught-up"), capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
        assert proc.returncode != 0
        last = proc.stderr.strip().splitlines()[-1]
        assert "names no topic: its column aggregatetype is NULL" in last, proc.stderr
        assert "outbox row of id 2 " in last and "Traceback" not in proc.stderr
        assert len(read_topic(kafka_bootstrap, topic, decode=False)) == 1
        assert not read_topic(kafka_bootstrap, f"{name}.", missing_ok=True, settle=0)
        # the NULL row's transaction is not confirmed: the slot still holds its insert
        assert "I" in pg.pending_changes(name, name)
    finally:
        pg.drop_slot(name)
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}")
        pg.close()
        delete_topics(kafka_bootstrap, [topic, f"{name}."])
