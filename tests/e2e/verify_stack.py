"""Shared set-up of the ``pgrouter verify`` tests: a router on the real stack, writers that
keep writing, running ``verify``, and damaging a topic (rewriting it with records left out,
altered or added)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time

import psycopg2

from tests.helpers import ROOT, start_router, stop_router, wait_logged


class Writer(threading.Thread):
    """Inserts, updates and deletes on ``table`` (``id int`` key, ``n int``) of keys from
    ``low`` to ``keys`` until stopped."""

    def __init__(self, dsn: str, table: str, keys: int, seed: int = 1, low: int = 1):
        super().__init__(daemon=True)
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        self.table, self.keys, self.low = table, keys, low
        self.stop = threading.Event()
        self.ops = 0
        self.rng = random.Random(seed)

    def run(self) -> None:
        t, rng = self.table, self.rng
        with self.conn.cursor() as cur:
            while not self.stop.is_set():
                k = rng.randrange(self.low, self.keys)
                op = rng.random()
                if op < 0.5:
                    cur.execute(f"update {t} set n = n + 1 where id = %s", (k,))
                elif op < 0.75:
                    cur.execute(f"insert into {t}(id, n) values (%s, %s) on conflict (id) do "
                                "update set n = excluded.n", (k, k))
                else:
                    cur.execute(f"delete from {t} where id = %s", (k,))
                self.ops += 1
                time.sleep(0.003)
        self.conn.close()

    def halt(self) -> None:
        self.stop.set()
        self.join(timeout=30)


def verify(cfg, *args: str, timeout: float = 120) -> tuple[int, dict | None, str]:
    """``pgrouter verify --json``: exit status, the document (None without one), stderr."""
    proc = subprocess.run([sys.executable, "-m", "actors.cli", "verify", "-c", str(cfg),
                           "--json", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)
    doc = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, doc, proc.stderr


def result(doc: dict, route: str) -> dict:
    [r] = [r for r in doc["results"] if r["route"] == route]
    return r


class Router:
    def __init__(self, cfg, log):
        self.cfg, self.log = cfg, log
        self.proc = start_router(cfg, log)

    def stop(self) -> None:
        stop_router(self.proc)


def wait_for(what: str, cond, log, timeout: float = 90):
    return wait_logged(what, cond, log, timeout)


def raw_records(bootstrap: str, topic: str) -> tuple[int, list[tuple]]:
    """The topic's partitions count and its records as (partition, key, value, headers)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = sorted(consumer.partitions_for_topic(topic) or ())
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out = []
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"timed out reading {topic}"
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                out.extend((m.partition, m.key, m.value, m.headers) for m in msgs
                           if m.offset < ends[tp])
        return len(parts), out
    finally:
        consumer.close()


def rewrite_topic(bootstrap: str, topic: str, change) -> int:
    """Deletes ``topic`` and writes it again with ``change(records)`` (records as
    ``raw_records`` gives them, each to its partition). Returns how many records it holds."""
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic

    parts, records = raw_records(bootstrap, topic)
    records = change(records)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        admin.delete_topics([topic])
        deadline = time.monotonic() + 120  # a loaded broker takes its time
        while True:
            try:
                admin.create_topics([NewTopic(topic, parts, 1)])
                break
            except Exception as exc:  # still being deleted
                assert time.monotonic() < deadline, f"{topic} was not deleted: {exc!r}"
                time.sleep(0.3)
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for partition, key, value, headers in records:
            producer.send(topic, key=key, value=value, partition=partition,
                          headers=list(headers or []))
        producer.flush(timeout=30)
    finally:
        producer.close()
    return len(records)


def json_value(value: bytes | None):
    return None if value is None else json.loads(value)
