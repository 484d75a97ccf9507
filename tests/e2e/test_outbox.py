"""An outbox route (``[routes.outbox]``) against real PostgreSQL and Kafka: rows the outbox held
before the slot are not snapshotted; each insert is one event on the topic its
aggregatetype names, keyed by aggregateid, the payload as written, the event id and the
chosen columns as headers; a row inserted and deleted in one transaction gives its event
once and nothing for the delete; updates give nothing. Read by a plain confluent-kafka
consumer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.sources import drop_made, new_table, source_config
from tests.helpers import ROOT, read_topic, run_router

pytestmark = pytest.mark.services


def test_outbox_inserts_are_events_and_nothing_else(pg_dsn, kafka_bootstrap, tmp_path):
    pg, name = new_table(pg_dsn, "obx", "id uuid primary key default gen_random_uuid(), "
                         "aggregatetype text not null, aggregateid text, type text, payload jsonb")
    orders, users = f"{name}_Order", f"{name}_User"
    pg.run(f"insert into {name} (aggregatetype, aggregateid, type, payload) "
           f"values ('{orders}', 'old', 'Old', '{{}}')")  # before the slot: never sent
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra="position_headers = true",
                        routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                               '[routes.outbox]\ntopic = "{aggregatetype}.events"\n'
                               'headers = ["type"]\n')
    topics = [f"{orders}.events", f"{users}.events"]
    try:
        run_router(cfg, timeout=300)  # the slot; the snapshot leaves the outbox out
        ids = []
        with pg.conn.cursor() as cur:
            pg.conn.autocommit = False
            for i in range(3):  # the outbox pattern: insert, then delete, in one transaction
                cur.execute(f"insert into {name} (aggregatetype, aggregateid, type, payload) "
                            "values (%s, %s, 'OrderCreated', %s) returning id",
                            (orders, f"o-{i}", json.dumps({"n": i, "note": "é"})))
                ids.append(cur.fetchone()[0])
                cur.execute(f"delete from {name} where id = %s", (ids[-1],))
                pg.conn.commit()
            cur.execute(f"insert into {name} (aggregatetype, aggregateid, type, payload) values "
                        f"(%s, 'u-1', 'UserSeen', null) returning id", (users,))
            ids.append(cur.fetchone()[0])
            pg.conn.commit()
            pg.conn.autocommit = True
        pg.run(f"update {name} set type = 'changed'")  # no event
        run_router(cfg)
        events = read_topic(kafka_bootstrap, topics[0], decode=False)
        assert [(r["raw"][0], json.loads(r["raw"][1])) for r in events] == [
            (f"o-{i}".encode(), {"n": i, "note": "é"}) for i in range(3)]
        assert [r["headers"]["id"] for r in events] == [str(i).encode() for i in ids[:3]]
        assert {r["headers"]["type"] for r in events} == {b"OrderCreated"}
        assert all(r["headers"]["pgrouter.commit_lsn"] for r in events)
        [user] = read_topic(kafka_bootstrap, topics[1], decode=False)
        assert user["raw"] == (b"u-1", None) and user["headers"]["id"] == str(ids[3]).encode()
        assert user["headers"]["type"] == b"UserSeen"
        status = subprocess.run([sys.executable, "-m", "actors.cli", "status", "-c", str(cfg),
                                 "--json"], capture_output=True, text=True, timeout=120,
                                cwd=ROOT)
        assert sorted(t["topic"] for t in json.loads(status.stdout)["routes"][name]) == topics
        bad = source_config(tmp_path / "bad.toml", pg_dsn, kafka_bootstrap, name,
                            routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                                   '[routes.outbox]\nkey = "aggregate_id"\n')
        checked = subprocess.run([sys.executable, "-m", "actors.cli", "check", "-c", str(bad)],
                                 capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert checked.returncode != 0 and "routes[0].outbox.key" in checked.stdout + \
            checked.stderr and "has no column 'aggregate_id'" in checked.stdout + checked.stderr
        # the payload as PostgreSQL writes the jsonb: the text the value holds
        assert events[0]["raw"][1].decode() == pg.one(
            "select %s::jsonb::text", json.dumps({"n": 0, "note": "é"}))
    finally:
        pg.conn.autocommit = True
        drop_made(pg, name, if_exists=False)
        delete_topics(kafka_bootstrap, topics)
