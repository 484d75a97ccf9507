"""Outbox rows a hostile application writes, against real PostgreSQL and Kafka, read by a
plain confluent-kafka consumer: a ``bytea`` payload is published as its bytes; a row whose
topic column is NULL stops the router with one line naming the route, table, event id, key
and LSN, and nothing past the events delivered is confirmed (the row is still in the slot);
with a dead-letter topic such rows (a NULL or too long topic column, a text payload that is
not JSON) go there with their reason in a header and the stream goes on."""

from __future__ import annotations

import subprocess

import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.sources import drop_made, new_table, source_config
from tests.helpers import ROOT, Pg, read_topic, router_cmd, run_router, unique

pytestmark = pytest.mark.services


def test_bytea_payload_and_a_null_topic_column(pg_dsn, kafka_bootstrap, tmp_path):
    pg, name = new_table(pg_dsn, "obxh", "id serial primary key, aggregatetype text, "
                         "aggregateid text, payload bytea")
    topic = f"{name}.Order"
    pg.run(f"alter table {name} replica identity full")
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
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
        assert f"(table public.{name}, key 'o-2', LSN " in last, last
        assert len(read_topic(kafka_bootstrap, topic, decode=False)) == 1
        assert not read_topic(kafka_bootstrap, f"{name}.", missing_ok=True, settle=0)
        # the NULL row's transaction is not confirmed: the slot still holds its insert
        assert "I" in pg.pending_changes(name, name)
    finally:
        drop_made(pg, name, if_exists=False)
        delete_topics(kafka_bootstrap, [topic, f"{name}."])


@pytest.mark.parametrize("exactly_once", [False, True])
def test_a_dead_letter_topic_takes_the_rows_that_make_no_event(pg_dsn, kafka_bootstrap,
                                                               tmp_path, exactly_once):
    pg, name = new_table(pg_dsn, "obxd", "id serial primary key, aggregatetype text, "
                         "aggregateid text, payload text")
    topic, dead = f"{name}.Order", f"{name}.dead"
    pg.run(f"create publication {name} for table {name}")
    kafka = 'client = "librdkafka"\nexactly_once = true\n' if exactly_once else ""
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name, kafka_extra=kafka,
                        routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                               f'[routes.outbox]\ntopic = "{name}.{{aggregatetype}}"\n'
                               f'dead_letter = "{dead}"\n')
    try:
        run_router(cfg, timeout=300)
        pg.run(f"insert into {name} (aggregatetype, aggregateid, payload) values "
               "('Order', 'o-1', '{\"n\": 1}'), (null, 'o-2', '{\"n\": 2}'), "
               "('Order', 'o-3', '{not json'), (repeat('x', 300), 'o-4', '{\"n\": 4}'), "
               "('Order', 'o-5', '{\"n\": 5}')")  # one transaction
        run_router(cfg)  # not stopped by the three poison rows
        assert [r["raw"] for r in read_topic(kafka_bootstrap, topic, decode=False)] == [
            (b"o-1", b'{"n": 1}'), (b"o-5", b'{"n": 5}')]
        letters = read_topic(kafka_bootstrap, dead, decode=False)
        assert [r["raw"] for r in letters] == [(b"o-2", b'{"n": 2}'), (b"o-3", b"{not json"),
                                               (b"o-4", b'{"n": 4}')]
        errors = [r["headers"]["pgrouter.error"].decode() for r in letters]
        assert errors[0] == "names no topic: its column aggregatetype is NULL"
        assert errors[1].startswith("its payload is not JSON (") and "\n" not in errors[1]
        assert "is 314 characters long, Kafka allows 249" in errors[2], errors
        assert {r["headers"]["pgrouter.table"] for r in letters} == {f"public.{name}".encode()}
        assert [r["headers"]["id"] for r in letters] == [b"2", b"3", b"4"]
        assert pg.pending_changes(name, name) == ""  # all of it confirmed
    finally:
        drop_made(pg, name, if_exists=False)
        delete_topics(kafka_bootstrap, [topic, dead])


@pytest.mark.parametrize("case", ["topic", "producer"])
@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_an_event_too_large_for_kafka_names_route_table_and_event_id(client, case, pg_dsn,
                                                                     kafka_bootstrap,
                                                                     tmp_path):
    """An outbox event Kafka will not take (above the topic's max.message.bytes, or the
    producer's request size) stops the router with the record-too-large line naming the
    route, the outbox table, the key and (where the client has its headers) the event id (it
    said "table (none)": an event has no envelope); nothing is confirmed past it."""
    pg = Pg(pg_dsn)
    name = unique("obxz")
    topic = f"{name}.Order"
    size, settings = ((20_000, 'topic_settings = { configs = { "max.message.bytes" = "4096" } }')
                      if case == "topic" else (1_500_000, ""))
    pg.run(f"create table {name} (id serial primary key, aggregatetype text, "
           "aggregateid text, payload text)")
    pg.run(f"alter table {name} alter column payload set storage external")  # no compression
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=f'client = "{client}"\n'
                        "[kafka.settings]\ndelivery_timeout_ms = 30000\n"
                        "request_timeout_ms = 10000\n",
                        routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                               f'{settings}\n'
                               f'[routes.outbox]\ntopic = "{name}.{{aggregatetype}}"\n')
    try:
        run_router(cfg, timeout=300)
        pg.run(f"insert into {name} (aggregatetype, aggregateid, payload) values "
               f"('Order', 'o-1', '{{}}'), ('Order', 'o-2', '\"' || repeat('x', {size}) || '\"')")
        proc = subprocess.run(router_cmd(cfg, "--until-caught-up"), capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("pgrouter run: record too large for Kafka:"), last
        assert f"topic {topic}, route '{name}', outbox table public.{name}, " in last, last
        assert "key o-2: " in last, last
        # librdkafka's report of the broker's refusal carries no headers: no event id there
        if client == "kafka-python" or case == "producer":
            assert ", event id 2, key o-2: " in last, last
        assert "(none)" not in last, last
        assert pg.pending_changes(name, name) == "II", "confirmed past an event not in Kafka"
    finally:
        drop_made(pg, name, if_exists=False)
        delete_topics(kafka_bootstrap, [topic])
