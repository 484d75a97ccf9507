"""The dev stack's services are real and reachable the ways pgrouter uses them."""

from __future__ import annotations

import uuid

import psycopg2
import psycopg2.extras
import pytest
import trio
import trio_asyncio

from actors.pipeline.slot_reader import _poll as poll_until_ok
from tests.helpers import Pg

pytestmark = pytest.mark.services


async def test_logical_slot_streams_a_change_over_the_replication_protocol(pg_dsn):
    name = f"t_{uuid.uuid4().hex[:8]}"
    sql = psycopg2.connect(pg_dsn)
    sql.autocommit = True
    cur = sql.cursor()
    cur.execute(f"create table {name} (id int primary key, v text)")
    cur.execute(f"create publication {name} for table {name}")
    cur.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
    cur.execute(f"insert into {name} values (1, 'hello')")
    repl = psycopg2.connect(pg_dsn, async_=True,
                            connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        await poll_until_ok(repl)
        rcur = repl.cursor()
        rcur.start_replication(slot_name=name, decode=False,
                               options={"proto_version": "1", "publication_names": name})
        await poll_until_ok(repl)
        kinds = []
        with trio.fail_after(30):
            while b"C" not in kinds:
                msg = rcur.read_message()
                if msg is None:
                    await trio.lowlevel.wait_readable(repl.fileno())
                    continue
                kinds.append(msg.payload[:1])
                if msg.payload[:1] == b"I":
                    assert b"hello" in msg.payload
        assert kinds[0] == b"B" and b"R" in kinds and b"I" in kinds
    finally:
        repl.close()
        sql.close()
        pg = Pg(pg_dsn)  # waits until the walsender of the closed connection let go
        pg.drop_slot(name)
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}")
        pg.close()


def test_kafka_produce_and_consume(kafka_bootstrap):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = f"stack-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all",
                             enable_idempotence=True)
    meta = producer.send(topic, key=b"k", value=b"v1").get(timeout=60)
    producer.close()
    assert meta.topic == topic and meta.offset == 0
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=20000)
    tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    ends = consumer.end_offsets(tps)
    got = []
    # up to the end offsets, not 20 s of silence after the last record (a record that never
    # comes still ends the loop by consumer_timeout_ms, with less than was sent)
    for m in consumer:
        got.append((m.key, m.value))
        if all(consumer.position(tp) >= ends[tp] for tp in tps):
            break
    consumer.close()
    assert got == [(b"k", b"v1")]


async def test_asyncpg_under_trio_asyncio(pg_dsn):
    import asyncpg

    async with trio_asyncio.open_loop():
        conn = await trio_asyncio.aio_as_trio(asyncpg.connect)(pg_dsn)
        try:
            value = await trio_asyncio.aio_as_trio(conn.fetchval)(
                "select current_setting('wal_level') || ':' || (40 + 2)::text")
        finally:
            await trio_asyncio.aio_as_trio(conn.close)()
    assert value == "logical:42"


@pytest.mark.pg_matrix
def test_each_version_runs_as_asked_with_logical_decoding(pg_dsn, pg_version):
    """The server of each version is that version, has wal_level=logical, both output
    plugins, and runs as the postgres user (never root)."""
    import os
    import pwd

    pg = Pg(pg_dsn)
    try:
        assert pg.one("select current_setting('server_version_num')::int / 10000") == pg_version
        assert pg.one("select current_setting('wal_level')") == "logical"
        name = f"v_{uuid.uuid4().hex[:8]}"
        for plugin in ("pgoutput", "test_decoding"):
            pg.run("select pg_create_logical_replication_slot(%s, %s)", name, plugin)
            pg.drop_slot(name)
        pid = pg.one("select pg_backend_pid()")
        assert os.stat(f"/proc/{pid}").st_uid == pwd.getpwnam("postgres").pw_uid
    finally:
        pg.close()


def test_kafka_ready_only_when_our_own_broker_answers(devstack, tmp_path):
    """A stack whose broker failed to bind while another stack's broker holds the port is
    not ready: the broker that answers must carry the cluster id our storage was formatted
    with (and our process must be alive)."""
    import os
    import pathlib

    from devstack.kafka import Kafka

    ours = Kafka(pathlib.Path(devstack.state_dir), devstack.kafka_port,
                 devstack.controller_port, tmp_path)
    assert ours.ready()
    other = Kafka(tmp_path, devstack.kafka_port, devstack.controller_port, tmp_path)
    (other.root / "data").mkdir(parents=True)
    (other.root / "data" / "meta.properties").write_text("cluster.id=AAAAAAAAAAAAAAAAAAAAAA\n")
    other.pidfile.write_text(str(os.getpid()))  # a live process, but not that broker
    assert not other.ready()
