"""An outbox route (``[routes.outbox]`` with Debezium's defaults) under ``kill -9``, read by a
consumer that knows only Debezium's Outbox Event Router conventions.

A service-like writer changes a business row and, in the same transaction, inserts its event
into the outbox and deletes it again (the outbox stays empty), for many aggregates of two
aggregate types, one of them ``purchase-order`` (Debezium's own example: a ``-`` in the
topic). The router (exactly-once) is killed with SIGKILL three times while the writer runs,
then catches up. The consumer subscribes to ``outbox.event.<aggregatetype>`` (Debezium's
``route.topic.replacement`` default), reads ``read_committed``, takes the key as text (what
Connect's ``StringConverter`` writes), the value as the payload's JSON (``StringConverter``,
or ``table.expand.json.payload``) and the event id from the ``id`` header. Against
PostgreSQL's SELECT: every committed event once, each aggregate's events in commit order, in
the partition Kafka's Java client would pick for the key (murmur2, kafka-python's own)."""

from __future__ import annotations

import json
import random
import threading
import time

import psycopg2
import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.sources import source_config
from tests.helpers import Pg, assign_from_beginning, kill9, run_router, start_router, unique

pytestmark = pytest.mark.services

TYPES = ("purchase-order", "customer")  # each with the test's own suffix
AGGREGATES = 12  # per type
MAX_EVENTS = 20_000  # the writer stops after the last kill, this is its bound
PARTITIONS = 3


class Writer(threading.Thread):
    """Transactions until ``stop`` is set, each: bump a business row's version, insert its
    event (payload: the aggregate and the version), delete the event row; what committed is
    kept."""

    def __init__(self, dsn: str, name: str, types: list[str]):
        super().__init__(daemon=True)
        self.dsn, self.name, self.types = dsn, name, types
        self.committed: list[tuple[str, str, int, str]] = []  # type, aggregateid, version, id
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self):
        rng = random.Random(7)
        try:
            conn = psycopg2.connect(self.dsn)
            with conn.cursor() as cur:
                while not self.stop.is_set() and len(self.committed) < MAX_EVENTS:
                    kind, agg = rng.choice(self.types), str(rng.randrange(AGGREGATES))
                    cur.execute(f"update {self.name}_acct set version = version + 1 "
                                "where kind = %s and id = %s returning version", (kind, agg))
                    version = cur.fetchone()[0]
                    cur.execute(f"insert into {self.name} (aggregatetype, aggregateid, type, "
                                "payload) values (%s, %s, 'Changed', %s) returning id",
                                (kind, agg, json.dumps({"agg": agg, "version": version,
                                                        "note": "é"})))
                    event = str(cur.fetchone()[0])
                    cur.execute(f"delete from {self.name} where id = %s", (event,))
                    conn.commit()
                    self.committed.append((kind, agg, version, event))
                    time.sleep(0.004)
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def debezium_outbox_consumer(bootstrap: str, aggregatetype: str) -> list[dict]:
    """The events of one aggregate type as a consumer written for Debezium's outbox reads
    them: topic ``outbox.event.<aggregatetype>``, read_committed, up to the stable end."""
    from confluent_kafka import Consumer, KafkaError, KafkaException

    topic = f"outbox.event.{aggregatetype}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("dbz-outbox"),
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True, "fetch.wait.max.ms": 10})
    try:
        assigned = assign_from_beginning(consumer, topic, settle=5)
        if assigned is None:
            return []
        ends, todo = assigned
        out, deadline = [], time.monotonic() + 60
        while todo:
            assert time.monotonic() < deadline, f"timed out reading {topic}"
            for m in consumer.consume(1000, 0.05):
                if m.error() is not None:
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(m.error())
                    todo.discard(m.partition())
                    continue
                if m.offset() < ends[m.partition()][1]:
                    out.append({"type": aggregatetype, "key": m.key().decode(),
                                "payload": json.loads(m.value()),
                                "id": dict(m.headers())["id"].decode(),
                                "partition": m.partition()})
                if m.offset() >= ends[m.partition()][1] - 1:
                    todo.discard(m.partition())
        return out
    finally:
        consumer.close()


def read_all(bootstrap: str, types: list[str]) -> list[dict]:
    return [e for kind in types for e in debezium_outbox_consumer(bootstrap, kind)]


def test_outbox_events_survive_kill9_in_commit_order_once(pg_dsn, kafka_bootstrap, tmp_path):
    from kafka.partitioner.default import murmur2

    pg = Pg(pg_dsn)
    name = unique("obk")
    types = [f"{kind}-{name[-8:]}" for kind in TYPES]  # topics of this test only
    pg.run(f"create table {name} (id uuid primary key default gen_random_uuid(), "
           "aggregatetype varchar(255) not null, aggregateid varchar(255) not null, "
           "type varchar(255) not null, payload jsonb)")
    pg.run(f"create table {name}_acct (kind text, id text, version int not null, "
           "primary key (kind, id))")
    pg.run(f"insert into {name}_acct select k, g::text, 0 from unnest(%s::text[]) k, "
           f"generate_series(0, {AGGREGATES - 1}) g", types)
    pg.run(f"create publication {name} for table {name}")
    topics = [f"outbox.event.{kind}" for kind in types]
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=f'client = "librdkafka"\nexactly_once = true\n'
                                    f'committed_lsn_topic = "{name}.progress"\n',
                        routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                               f'topic_settings = {{ partitions = {PARTITIONS} }}\n'
                               '[routes.outbox]\n')
    # the slot is confirmed seconds after the Kafka commit: kills land in between
    cfg.write_text(cfg.read_text().replace("status_interval = 0.5", "status_interval = 3"))
    writer, proc = Writer(pg_dsn, name, types), None
    try:
        run_router(cfg)  # the slot, before the writer
        writer.start()
        rng, seen, proc = random.Random(9), 0, None
        for i in range(3):
            log = tmp_path / f"router-{i}.log"
            proc = start_router(cfg, log)
            deadline = time.monotonic() + 120
            while len(read_all(kafka_bootstrap, types)) < seen + 100:  # placed by observed progress
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            time.sleep(rng.uniform(0.0, 0.5))
            assert proc.poll() is None, log.read_text()[-3000:]
            kill9(proc)
            seen = len(read_all(kafka_bootstrap, types))
        assert writer.is_alive(), f"the writer stopped before the last kill: {writer.error!r}"
        writer.stop.set()
        writer.join(timeout=60)
        assert not writer.is_alive() and writer.error is None, repr(writer.error)
        run_router(cfg, timeout=300)

        events = read_all(kafka_bootstrap, types)
        ids = [e["id"] for e in events]
        assert len(ids) == len(set(ids)), "an event reached read_committed twice"
        assert sorted(ids) == sorted(c[3] for c in writer.committed), "events lost or made up"
        versions = {(k, a): v for k, a, v in pg.run(f"select kind, id, version from {name}_acct")}
        for (kind, agg), top in versions.items():
            mine = [e for e in events if e["type"] == kind and e["key"] == agg]
            assert [e["payload"]["version"] for e in mine] == list(range(1, top + 1)), (kind, agg)
            assert {e["partition"] for e in mine} == {
                (murmur2(agg.encode()) & 0x7FFFFFFF) % PARTITIONS}, (kind, agg)
        assert all(e["payload"]["note"] == "é" for e in events)
        assert pg.one(f"select count(*) from {name}") == 0
    finally:
        if proc is not None:
            kill9(proc)
        writer.stop.set()
        writer.join(timeout=60)
        pg.drop_slot(name)
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}, {name}_acct")
        pg.close()
        delete_topics(kafka_bootstrap, topics + [f"{name}.progress"])
