"""A breaker's outbox rows against real PostgreSQL and Kafka, read by a plain confluent-kafka
consumer: odd rows (unicode, empty and nested-escape payloads, NULL id, key and payload,
topic values with odd characters, topics of exactly 249 and 250 characters) published the
same by the C event maker and its Python twin (``PGROUTER_PURE_PYTHON=1``), byte for byte."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.sources import drop_made, new_table, source_config
from tests.helpers import ROOT, read_topic, router_cmd, write_config

pytestmark = pytest.mark.services


def _run(cfg, pure: bool) -> None:
    env = dict(os.environ)
    env.pop("PGROUTER_PURE_PYTHON", None)
    if pure:
        env["PGROUTER_PURE_PYTHON"] = "1"
    proc = subprocess.run(router_cmd(cfg, "--until-caught-up"), capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _shown(records: list[dict], side: str, name: str) -> list:
    mine = f"{side}{name}".encode()  # the two routers' topics differ in their first letter
    return [(r["raw"], sorted((k, v if v is None else v.replace(mine, b"*"))
                              for k, v in r["headers"].items()
                              if not k.startswith("pgrouter.lsn") and k != "pgrouter.seq"))
            for r in records]


@pytest.mark.parametrize("payload_type", ["jsonb", "json"])
def test_odd_rows_make_the_same_bytes_in_c_and_in_python(pg_dsn, kafka_bootstrap, tmp_path,
                                                         payload_type):
    pg, name = new_table(pg_dsn, "obxb", "seq bigserial primary key, id text, aggregatetype text, "
                         f"aggregateid text, payload {payload_type}, kind text")
    pg.run(f"create publication {name} for table {name}")
    prefix_len = len(f"c{name}.")
    fill = 249 - prefix_len
    odd = ["Order", "a b", "ünï\u00e9😀", "", "-", "Order", fill * "x", (fill + 1) * "y",
           None, "Order", "a\u0301", "Order"]
    payloads = ['{"a": "\\u00e9\\ud83d\\ude00", "b": {"c": "\\"\\\\\\/\\n"}}', '{}', '""',
                None, '{"big": "%s"}' % ("é" * 20000), '[1, 2.50, 1e400]', 'null',
                '{"k": "ü"}', '{"x": 1}', '"\\u2028"', '0', '{"a": [{}]}']
    ids = ["1", None, "ü-3", "", "5", "6", "7", "8", "9", "10", "11", "12"]
    keys = ["k1", "k2", None, "ключ", "", "k6", "k7", "k8", "k9", "k😀", "k11", "k12"]
    values = ", ".join("(%s, %s, %s, %s::%s)" % tuple(
        ["null" if v is None else "'" + v.replace("'", "''") + "'"
         for v in (i, t, k, p)] + [payload_type])
        for i, t, k, p in zip(ids, odd, keys, payloads))
    cfgs, topics = {}, set()
    for side in ("c", "p"):
        cfgs[side] = write_config(
            tmp_path / f"{side}.toml", dsn=pg_dsn, slot=f"{name}{side}", publications=[name],
            bootstrap=kafka_bootstrap,
            routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                   f'[routes.outbox]\ntopic = "{side}{name}.{{aggregatetype}}"\n'
                   f'headers = ["kind"]\ndead_letter = "{side}{name}.dead"\n')
    try:
        for side in ("c", "p"):
            _run(cfgs[side], side == "p")  # the slots made
        pg.run(f"insert into {name} (id, aggregatetype, aggregateid, payload) values {values}")
        pg.run(f"insert into {name} (id, aggregatetype, aggregateid, payload, kind) values "
               f"{values.replace('::' + payload_type + ')', '::' + payload_type + ', $$h$$)')}")
        for side in ("c", "p"):
            _run(cfgs[side], side == "p")
        from kafka import KafkaAdminClient
        admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="t")
        try:
            made = sorted(t for t in admin.list_topics() if name in t)
        finally:
            admin.close()
        topics.update(made)
        c_topics = sorted(t[1:] for t in made if t.startswith("c"))
        p_topics = sorted(t[1:] for t in made if t.startswith("p"))
        assert c_topics == p_topics
        assert f"{name}.Order" in c_topics and f"{name}.dead" in c_topics
        assert f"{name}." + fill * "x" in c_topics
        for t in c_topics:
            c = _shown(read_topic(kafka_bootstrap, "c" + t, decode=False), "c", name)
            p = _shown(read_topic(kafka_bootstrap, "p" + t, decode=False), "p", name)
            assert c == p, t
        dead = read_topic(kafka_bootstrap, f"c{name}.dead", decode=False)
        assert len(dead) == 4  # the NULL and 250-char topics, twice
        events = read_topic(kafka_bootstrap, f"c{name}.Order", decode=False)
        assert [r["headers"]["id"] for r in events] == [b"1", b"6", b"10", b"12"] * 2
    finally:
        for side in ("c", "p"):
            pg.drop_slot(f"{name}{side}")
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}")
        pg.close()
        delete_topics(kafka_bootstrap, sorted(topics))


def test_a_topic_colliding_in_dot_and_underscore_goes_to_the_dead_letter_topic(
        pg_dsn, kafka_bootstrap, tmp_path):
    """Kafka refuses a topic differing from one it holds only in '.' versus '_' (their metric
    names collide): with dead_letter the colliding event is a dead letter naming the topic it
    collides with, met within a run and at a start (the topic made by an earlier run);
    without, the router stops at it with one line naming route, table, id and both topics,
    confirming nothing past it (it stopped with Kafka's bare line at every start, even with
    dead_letter)."""
    pg, name = new_table(pg_dsn, "obxk", "id serial primary key, aggregatetype text, "
                         "aggregateid text, payload jsonb")
    pg.run(f"create publication {name} for table {name}")
    route = f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n' \
            f'[routes.outbox]\ntopic = "{name}.{{aggregatetype}}"\n'
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        routes=route + f'dead_letter = "{name}.dead"\n')
    bare = write_config(tmp_path / "b.toml", dsn=pg_dsn, slot=f"{name}b", publications=[name],
                        bootstrap=kafka_bootstrap, routes=route)
    topics = [f"{name}.a_b", f"{name}.a.b", f"{name}.dead"]

    def insert(kind: str) -> None:
        pg.run(f"insert into {name} (aggregatetype, aggregateid, payload) "
               f"values ('{kind}', 'k', '1')")
    try:
        _run(cfg, False)
        for kind in ("a_b", "a.b", "a_b"):
            insert(kind)
        _run(cfg, False)  # a_b made in this run, then a.b met
        insert("a.b")  # at the next start a_b is Kafka's already
        _run(cfg, False)
        events = read_topic(kafka_bootstrap, f"{name}.a_b", decode=False)
        assert [r["headers"]["id"] for r in events] == [b"1", b"3"]
        dead = read_topic(kafka_bootstrap, f"{name}.dead", decode=False)
        assert [r["headers"]["id"] for r in dead] == [b"2", b"4"]
        for r in dead:
            why = r["headers"]["pgrouter.error"].decode()
            assert f"'{name}.a.b'" in why and f"'{name}.a_b'" in why, why
            assert "differ only in '.' and '_'" in why, why
            assert r["headers"]["pgrouter.table"] == f"public.{name}".encode()
        from kafka import KafkaAdminClient
        admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="t")
        try:
            assert f"{name}.a.b" not in admin.list_topics()
        finally:
            admin.close()
        # without dead_letter: one line, and the slot keeps the row and what follows it
        pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", f"{name}b")
        insert("a_b")
        insert("a.b")
        insert("a_b")
        proc = subprocess.run(router_cmd(bare, "--until-caught-up"), capture_output=True,
                              text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 2, proc.stderr[-3000:]  # the config's to change
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        last = proc.stderr.strip().splitlines()[-1]
        for part in (f"route '{name}'", "id 6", f"table public.{name}", f"'{name}.a.b'",
                     f"'{name}.a_b'"):
            assert part in last, last
        # the rows from the colliding one on (the one before it may be confirmed)
        assert pg.pending_changes(f"{name}b", name) in ("II", "III"), "confirmed past the row"
        events = read_topic(kafka_bootstrap, f"{name}.a_b", decode=False)
        assert [r["headers"]["id"] for r in events] in ([b"1", b"3"], [b"1", b"3", b"5"])
    finally:
        pg.drop_slot(name)
        pg.drop_slot(f"{name}b")
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}")
        pg.close()
        delete_topics(kafka_bootstrap, topics)


def test_dead_letters_under_exactly_once_survive_kill9_once(pg_dsn, kafka_bootstrap, tmp_path):
    """A writer whose every other event has a NULL topic column (a dead letter); the
    exactly-once router killed with SIGKILL as soon as a read_uncommitted reader sees a new
    dead letter (its Kafka transaction likely open), three times: read_committed, every
    committed event and dead letter once, each in commit order."""
    import random
    import threading
    import time

    import psycopg2

    from tests.e2e.test_outbox_kill9 import debezium_outbox_consumer
    from tests.helpers import kill9, run_router, start_router

    pg, name = new_table(pg_dsn, "obxx", "id uuid primary key default gen_random_uuid(), "
                         "aggregatetype text, aggregateid text, payload jsonb")
    good, dead = f"order-{name[-8:]}", f"dead-{name[-8:]}"
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=f'client = "librdkafka"\nexactly_once = true\n'
                                    f'committed_lsn_topic = "{name}.progress"\n',
                        routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                               f'[routes.outbox]\ndead_letter = "outbox.event.{dead}"\n')
    cfg.write_text(cfg.read_text().replace("status_interval = 0.5", "status_interval = 3"))
    committed: list[tuple[str | None, int, str]] = []
    stop, errors = threading.Event(), []

    def write():
        try:
            conn = psycopg2.connect(pg_dsn)
            with conn.cursor() as cur:
                n = 0
                while not stop.is_set() and n < 20_000:
                    n += 1
                    kind = good if n % 2 else None
                    cur.execute(f"insert into {name} (aggregatetype, aggregateid, payload) "
                                "values (%s, 'a', %s) returning id", (kind, f'{{"n": {n}}}'))
                    event = str(cur.fetchone()[0])
                    cur.execute(f"delete from {name} where id = %s", (event,))
                    conn.commit()
                    committed.append((kind, n, event))
                    time.sleep(0.004)
            conn.close()
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    writer, proc = threading.Thread(target=write, daemon=True), None
    topics = [f"outbox.event.{good}", f"outbox.event.{dead}", f"{name}.progress"]
    try:
        run_router(cfg)
        writer.start()
        for i in range(3):
            log = tmp_path / f"router-{i}.log"
            proc = start_router(cfg, log)
            seen = len(read_topic(kafka_bootstrap, topics[1], missing_ok=True, settle=0,
                                  decode=False))
            deadline = time.monotonic() + 120
            while len(read_topic(kafka_bootstrap, topics[1], missing_ok=True, settle=0,
                                 decode=False)) < seen + 20 + i:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
            kill9(proc)
        stop.set()
        writer.join(timeout=60)
        assert not errors, errors
        run_router(cfg, timeout=300)
        for kind, topic in ((good, good), (None, dead)):
            got = debezium_outbox_consumer(kafka_bootstrap, topic)
            assert [e["payload"]["n"] for e in got] == [n for k, n, _ in committed if k == kind]
            assert [e["id"] for e in got] == [e for k, _, e in committed if k == kind]
    finally:
        if proc is not None:
            kill9(proc)
        stop.set()
        writer.join(timeout=60)
        drop_made(pg, name, if_exists=False)
        delete_topics(kafka_bootstrap, topics)
