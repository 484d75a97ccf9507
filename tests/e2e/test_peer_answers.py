"""Services that answer, but not as they should, through the real CLI against the real stack:
a schema registry URL answering ``200 text/html`` (a login page) is one ``check`` line, and
``run`` refuses it the same way; a Kafka address that accepts connections and never answers
is one ``status`` line within seconds, beside the slot it could read; and a topic written in
Kafka transactions has a record count (its offsets, an upper bound: docs/operations.md),
checked against a plain confluent_kafka read_committed consumer."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers import ROOT, Pg, unique, write_config
from tests.http_kit import answer

pytestmark = pytest.mark.services

LOGIN = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head>\n<body>login</body></html>"


def pgrouter(*args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture
def source(pg_dsn, kafka_bootstrap, tmp_path):
    """A table with a publication and a slot; ``source.config(**kw)`` writes a router config
    routing it to the topic of its name. Everything made is dropped."""
    pg = Pg(pg_dsn)
    name = unique("peer")
    pg.run(f"create table {name} (id int primary key, v text)")
    pg.run(f"create publication {name} for table {name}")
    pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", name)

    def config(bootstrap=kafka_bootstrap, kafka_extra=""):
        return write_config(tmp_path / "c.toml", dsn=pg_dsn, slot=name, publications=[name],
                            bootstrap=bootstrap, kafka_extra=kafka_extra,
                            routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]'
                                   f'\ntopic = "{name}"\ntopic_settings = {{ partitions = 2 }}\n')

    source.pg, source.name, source.config = pg, name, config
    yield source
    pg.drop_slot(name)
    pg.run(f"drop publication {name}")
    pg.run(f"drop table {name}")
    pg.close()
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    if name in admin.list_topics(timeout=10).topics:
        admin.delete_topics([name])[name].result(timeout=30)


@pytest.fixture
def login_page():
    """An HTTP server answering every request with ``200 text/html`` (a login page)."""
    class Handler(BaseHTTPRequestHandler):
        def _page(self):
            answer(self, 200, LOGIN, "text/html; charset=utf-8")

        do_GET = do_POST = do_PUT = _page  # noqa: N815 — the stdlib's names

        def log_message(self, format, *args):  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/apis/ccompat/v7"
    server.shutdown()
    server.server_close()


def test_a_registry_answering_a_login_page_is_a_check_finding(source, login_page):
    cfg = source.config(kafka_extra=f'client = "librdkafka"\nformat = "avro"\n'
                                    f'[kafka.registry]\nurl = "{login_page}"\n')
    check = pgrouter("check", "-c", str(cfg))
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stdout + check.stderr
    assert "ok" not in check.stdout.splitlines()
    (line,) = [ln for ln in check.stdout.splitlines() if "registry" in ln]
    assert line.startswith("kafka.registry.url") and "answered 200 (text/html" in line, line
    assert "Sign in" in line and "/apis/ccompat/v7" in line, line
    run = pgrouter("run", "-c", str(cfg), "--until-caught-up")
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert f"pgrouter run: {line}" in run.stderr.splitlines(), run.stderr[-2000:]


@pytest.fixture
def hung_broker():
    """A TCP port that accepts connections and never answers (a hung broker)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(timeout=5)
    for s in held + [listener]:
        s.close()


def test_status_against_a_hung_broker_answers_within_seconds(source, hung_broker):
    cfg = source.config(bootstrap=hung_broker)
    started = time.monotonic()
    proc = pgrouter("status", "-c", str(cfg), timeout=60)
    took = time.monotonic() - started
    assert took < 12, took  # the process with its imports; the client waited 30 s before
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"slot {source.name}: inactive, confirmed "), lines
    (kafka,) = [ln for ln in lines if "Kafka" in ln]
    assert kafka.startswith("kafka.bootstrap_servers: Kafka not reachable: "
                            f"{hung_broker} accepts connections but gave no Kafka answer"), kafka


def _transactions(bootstrap: str, topic: str) -> None:
    """Two committed Kafka transactions (3 and 2 records) and an aborted one between them."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the result
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=30)
    p = Producer({"bootstrap.servers": bootstrap,
                  "transactional.id": f"pgrouter-test-{uuid.uuid4().hex[:8]}"})
    p.init_transactions(30)
    for n, commit in ((3, True), (1, False), (2, True)):
        p.begin_transaction()
        for i in range(n):
            p.produce(topic, key=str(i).encode(), value=b"{}", partition=i % 2)
        (p.commit_transaction if commit else p.abort_transaction)(30)


def _read_committed(bootstrap: str, topic: str) -> tuple[int, int]:
    """(records a read_committed consumer reads, the topic's offsets) by confluent_kafka."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("peer"),
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    try:
        marks = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in (0, 1)]
        c.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
        n, deadline = 0, time.monotonic() + 30
        while time.monotonic() < deadline:
            msgs = c.consume(100, timeout=1)
            n += sum(1 for m in msgs if m.error() is None)
            if not msgs and n:
                break
        return n, sum(high - low for low, high in marks)
    finally:
        c.close()


def test_status_counts_an_exactly_once_topic(source, kafka_bootstrap):
    _transactions(kafka_bootstrap, source.name)
    cfg = source.config(kafka_extra=f'exactly_once = true\n'
                                    f'committed_lsn_topic = "{source.name}.p"\n')
    proc = pgrouter("status", "-c", str(cfg), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (topic,) = json.loads(proc.stdout)["routes"][source.name]
    committed, offsets = _read_committed(kafka_bootstrap, source.name)
    assert committed == 5
    # the offsets: the committed records, the aborted one and a marker per partition and
    # transaction; an upper bound of what a read_committed consumer reads
    assert topic["records"] == topic["offsets"] == offsets >= committed, topic
    assert topic["records_exact"] is False
    text = pgrouter("status", "-c", str(cfg)).stdout
    assert f"  {source.name}: {offsets} records at most (offsets: Kafka transaction" in text
