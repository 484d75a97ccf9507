"""A row whose record Kafka will not take stops ``pgrouter run`` with one line that names the
topic, the table, the key and the size, and what to change, with either Kafka client, for
both limits: the topic's ``max.message.bytes`` (checked by the broker) and the producer's own
request size; nothing is confirmed past the row."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.e2e.sources import new_table, source_config
from tests.helpers import ROOT, Pg, drop_source, router_cmd, unique

pytestmark = pytest.mark.services
TIMEOUT = 120

CASES = {
    # a 20 kB value into a topic that takes 4 kB
    "topic": (20_000, "topic_settings = { configs = { \"max.message.bytes\" = \"4096\" } }",
              ["max.message.bytes", "topic_settings.configs"]),
    # a 1.5 MB value: above both producers' default request size (the dev broker takes 10 MB)
    "producer": (1_500_000, "", ["max_request_size", "message.max.bytes"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_record_too_large_names_topic_table_key_size_and_setting(client, case, pg_dsn,
                                                                  kafka_bootstrap, tmp_path):
    size, topic_settings, settings = CASES[case]
    pg, name = new_table(pg_dsn, "big", "id int primary key, v text")
    topic = f"{name}.public.{name}"
    pg.run(f"alter table {name} alter column v set storage external")  # no compression
    pg.run(f"create publication {name} for table {name}")
    pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", name)
    cfg = source_config(tmp_path / "router.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=f'client = "{client}"\n'
                        "[kafka.settings]\ndelivery_timeout_ms = 30000\n"
                        "request_timeout_ms = 10000\n",
                        routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                               f'topic = "{topic}"\n{topic_settings}\n')
    try:
        pg.run(f"insert into {name} values (1, 'small'), (7, repeat('x', {size}))")
        proc = subprocess.run(router_cmd(cfg, "--until-caught-up"), capture_output=True,
                              text=True, timeout=TIMEOUT, cwd=ROOT)
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("pgrouter run: record too large for Kafka:"), proc.stderr[-3000:]
        assert f"topic {topic}," in last and f"table public.{name}," in last, last
        assert 'key {"id":7}' in last, last
        got = int(re.search(r"(\d+) bytes,", last).group(1))
        assert size < got < size + 2000, last
        for setting in settings:
            assert setting in last, last
        # the slot still holds both rows (other sessions' writes may move it up to them)
        assert pg.pending_changes(name, name) == "II", "confirmed past a row not in Kafka"
    finally:
        drop_source(pg, name, kafka_bootstrap, (topic,))


@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_record_too_large_in_the_backfill_finishing_an_initial_snapshot(client, pg_dsn,
                                                                        kafka_bootstrap,
                                                                        tmp_path):
    """The initial snapshot was interrupted; the backfill that finishes it meets a row Kafka
    will not take while writers keep the stream busy: the one record-too-large line, every
    run (it was a bare ``BrokenResourceError`` with a traceback in most runs)."""
    import threading

    import psycopg2
    from kafka import KafkaProducer

    from router.snapshot.core import SnapshotState, encode_state

    pg = Pg(pg_dsn)
    name = unique("bigb")
    for t in ("a", "b"):
        pg.run(f"create table {name}_{t} (id int primary key, v text)")
        pg.run(f"insert into {name}_{t} select g, 'x' from generate_series(1, 20000) g")
    pg.run(f"update {name}_b set v = repeat(md5(g::text), 70000) from generate_series(1, 1) g "
           "where id = 15000")  # 2.2 MB
    pg.run(f"create publication {name} for table {name}_a, {name}_b")
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    key, value = encode_state(SnapshotState("initial", name, "started"))
    producer.send("pgrouter.snapshots", key=key, value=value).get(timeout=30)
    producer.close()
    pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", name)
    cfg = source_config(tmp_path / "router.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=f'client = "{client}"\n',
                        routes=f'[[routes]]\nname = "r"\n'
                               f'tables = ["public.{name}_a", "public.{name}_b"]\n'
                               f'topic = "{name}.{{table}}"\n',
                        extra="[snapshot]\nchunk_rows = 500\nparallel = 2\n")
    stop = threading.Event()

    def write():
        conn = psycopg2.connect(pg_dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            i = 100_000
            while not stop.is_set():
                cur.execute(f"insert into {name}_a values (%s, 'w')", (i,))
                i += 1
        conn.close()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(3):
            proc = subprocess.run(router_cmd(cfg, "--until-caught-up"), capture_output=True,
                                  text=True, timeout=TIMEOUT, cwd=ROOT)
            lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("pgrouter run:")]
            assert proc.returncode == 1, proc.stderr[-3000:]
            assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
            assert len(lines) == 1 and "record too large for Kafka" in lines[0], lines
            assert f"table public.{name}_b" in lines[0] and '{"id":15000}' in lines[0]
    finally:
        stop.set()
        writer.join()
        pg.drop_slot(name)
        pg.run(f"drop publication {name}; drop table {name}_a, {name}_b")
        pg.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_record_too_large_in_the_initial_snapshot(case, pg_dsn, kafka_bootstrap, tmp_path):
    """The initial snapshot's records go packed through the C-driven producer (librdkafka,
    JSON): a row Kafka will not take stops the router with the same one line, and the
    snapshot is not recorded done (the next start finishes it by backfill)."""
    from tests.e2e.test_backfill import progress

    size, topic_settings, settings = CASES[case]
    pg, name = new_table(pg_dsn, "bigs", "id int primary key, v text")
    topic = f"{name}.public.{name}"
    pg.run(f"alter table {name} alter column v set storage external")  # no compression
    # the broker refuses a whole producer batch above the topic's limit, so against a 4 kB
    # topic a few rows; else two batches of the snapshot (about 2000 rows each)
    rows, big = (10, 7) if case == "topic" else (3000, 2007)
    pg.run(f"insert into {name} select g, 'small' from generate_series(1, {rows}) g")
    pg.run(f"update {name} set v = repeat('x', {size}) where id = {big}")
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "router.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra='client = "librdkafka"\n'
                        "[kafka.settings]\ndelivery_timeout_ms = 30000\n"
                        "request_timeout_ms = 10000\n",
                        routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                               f'topic = "{topic}"\n{topic_settings}\n')
    try:
        proc = subprocess.run(router_cmd(cfg, "--until-caught-up"), capture_output=True,
                              text=True, timeout=TIMEOUT, cwd=ROOT)
        assert "packed, produced in C" in proc.stderr, proc.stderr[-3000:]
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("pgrouter run: record too large for Kafka:"), proc.stderr[-3000:]
        assert f"topic {topic}," in last and f"table public.{name}," in last, last
        assert f'key {{"id":{big}}}' in last, last
        got = int(re.search(r"(\d+) bytes,", last).group(1))
        assert size < got < size + 2000, last
        for setting in settings:
            assert setting in last, last
        assert not [p for p in progress(kafka_bootstrap, name)
                    if p["state"] == "done" and p["request"] == "initial"
                    and p["table"] == f"public.{name}"]
    finally:
        drop_source(pg, name, kafka_bootstrap, (topic,))

