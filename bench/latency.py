"""Commit-to-consumer latency under a steady stream of single-row transactions.

    .venv/bin/python bench/latency.py [--rate 1000] [--writers 4] [--seconds 20]
                                      [--client auto|librdkafka|kafka-python]
                                      [--setting linger_ms=5 ...] [--dsn …] [--bootstrap …]
                                      [--router-root DIR] [--ha]
                                      [--transaction-interval-ms N]

``--writers`` connections insert one row per transaction (autocommit), paced together at
``--rate`` transactions a second (open loop: each writer follows its own schedule, so a slow
commit does not lower the offered rate); they run as threads of a process of their own, apart
from the consumer's (which measures), so neither waits for the other's interpreter lock. ``pgrouter run`` streams the table to a topic of its
own; a consumer (confluent-kafka when installed, else kafka-python) reads it and measures,
for every record, the time from the source transaction's commit (the value's
``source.commit_time``, the server's clock; server, router and consumer share this machine's
clock) to the moment the consumer has it. It prints the achieved rate and p50/p90/p99/max of
the latency, and fails unless every row written arrived. The first ``--warmup`` seconds of
load are left out of the figures (process start, topic creation, first metadata).

Each record's CreateTime (set by the router's producer when the router hands it the record,
in milliseconds) splits the latency into *commit -> the router's produce call* (PostgreSQL's
walsender and the router) and *produce call -> consumer* (the producer's ``linger.ms``, the
broker and the consumer).

**Kafka alone** (the ceiling; ``--no-ceiling`` skips it): after the router's run, the same
rate of records of the same shape and size is produced to a new topic by a process of its own
with the router's librdkafka settings (``actors.kafka.librdkafka.DEFAULTS`` and the
``--setting`` entries, acks=all, idempotence, a poll thread), each record stamped with the
time it is handed to the producer, and read by the same consumer: what the broker, the
producer's linger and the consumer cost at all on this machine, with no PostgreSQL and no
router. The router cannot be below it; the difference is the router's (and the walsender's)
share.

Table, publication, slot and topics are removed afterwards, also after a failure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from machine import cpu_of  # noqa: E402  (bench/machine.py)

import psycopg2  # noqa: E402

from bench.e2e import delete_topics, sql  # noqa: E402


def config(dsn: str, bootstrap: str, slot: str, pub: str, table: str, client: str,
           topic: str, prefix: str, settings: dict[str, str], extra_toml: str = "",
           kafka_toml: str = "") -> str:
    extra = "".join(f"{k} = {v}\n" for k, v in settings.items())
    return f"""
[source]
dsn = "{dsn}"
slot = "{slot}"
create_slot = true
publications = ["{pub}"]
[kafka]
bootstrap_servers = "{bootstrap}"
client = "{client}"
schema_topic = "{prefix}.schemas"
definitions_topic = "{prefix}.definitions"
{kafka_toml}
[kafka.settings]
{extra}
[[routes]]
name = "{prefix}"
tables = ["public.{table}"]
topic = "{topic}"
[log]
progress_interval = 5.0
{extra_toml}"""


def parse_iso(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


class Consumer(threading.Thread):
    """Reads the topic from its beginning; ``seen`` maps row id -> latency in seconds."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.seen: dict[int, float] = {}
        #: row id -> (commit -> the router's produce call, produce call -> consumer), seconds:
        #: the record's CreateTime timestamp is set by the router's producer when it is given
        #: the record (librdkafka and kafka-python alike), in milliseconds
        self.split: dict[int, tuple[float, float]] = {}
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def _take(self, value: bytes, created_ms: int | None = None) -> None:
        now = time.time()
        doc = json.loads(value)
        doc = doc.get("payload", doc)  # Connect format wraps the value
        after = doc.get("after")
        if after is not None:
            committed = parse_iso(doc["source"]["commit_time"])
            self.seen[after["id"]] = now - committed
            if created_ms is not None and created_ms > 0:
                self.split[after["id"]] = (created_ms / 1000 - committed,
                                           now - created_ms / 1000)

    def run(self) -> None:
        try:
            try:
                import confluent_kafka
            except ImportError:
                confluent_kafka = None
            if confluent_kafka is not None:
                self._run_rdkafka(confluent_kafka)
            else:
                self._run_kafka_python()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _run_rdkafka(self, ck) -> None:
        c = ck.Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"lat-{uuid.uuid4()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "fetch.wait.max.ms": 5, "topic.metadata.refresh.interval.ms": 500,
                         "allow.auto.create.topics": False})
        c.subscribe([self.topic])
        try:
            while not self.stop.is_set():
                # poll: returns with the first record (consume(n, t) waits for n or t)
                m = c.poll(0.05)
                if m is not None and m.error() is None and m.value() is not None:
                    kind, created = m.timestamp()
                    self._take(m.value(), created if kind == ck.TIMESTAMP_CREATE_TIME else None)
        finally:
            c.close()

    def _run_kafka_python(self) -> None:
        from kafka import KafkaConsumer
        c = KafkaConsumer(bootstrap_servers=self.bootstrap, auto_offset_reset="earliest",
                          enable_auto_commit=False, fetch_max_wait_ms=5,
                          metadata_max_age_ms=500)
        c.subscribe([self.topic])
        try:
            while not self.stop.is_set():
                for records in c.poll(timeout_ms=50).values():
                    for r in records:
                        if r.value is not None:
                            self._take(r.value, r.timestamp if r.timestamp_type == 0 else None)
        finally:
            c.close()


def paced(rate: float, start: float, until: float):
    """0, 1, 2… each at its time on a schedule of ``rate`` a second from ``start`` to
    ``until`` (open loop: a late one does not move the ones after it)."""
    i = 0
    while True:
        due = start + i / rate
        if due >= until:
            return
        delay = due - time.time()
        if delay > 0:
            time.sleep(delay)
        yield i
        i += 1


def writer(dsn: str, table: str, wid: int, rate: float, start: float, until: float,
           written: list, errors: list) -> None:
    """One row per transaction at ``rate`` a second from ``start`` to ``until``."""
    try:
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        cur = conn.cursor()
        for i in paced(rate, start, until):
            rid = wid * 1_000_000_000 + i
            cur.execute(f"insert into {table} values (%s, %s)", (rid, "x" * 40))
            written.append(rid)
        conn.close()
    except BaseException as exc:
        errors.append(exc)


def writers_process(dsn: str, table: str, writers: int, rate: float, start: float,
                    until: float, out) -> None:
    """The writers' process (apart from the consumer's, so neither waits for the other's
    GIL): one thread per writer; sends back the ids written and the first error."""
    written: list[int] = []
    errors: list = []
    threads = [threading.Thread(target=writer, args=(
        dsn, table, w, rate / writers, start + w / rate, until, written, errors))
        for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.send((written, repr(errors[0]) if errors else None))
    out.close()


def kafka_alone_process(bootstrap: str, topic: str, settings: dict, rate: float,
                        start: float, until: float, out) -> None:
    """The ceiling's producer: records shaped like the router's (an ``after`` with the id,
    ``source.commit_time`` = the moment the record is handed over), one at a time at
    ``rate`` (open loop), produced with the router's librdkafka settings."""
    try:
        import confluent_kafka as ck

        from actors.kafka.librdkafka import DEFAULTS
        from router.kafka_settings import LIBRDKAFKA, translate

        conf = dict(DEFAULTS)
        conf.update(translate(dict(settings), LIBRDKAFKA))
        conf.update({"bootstrap.servers": bootstrap, "acks": "all",
                     "enable.idempotence": True})
        producer = ck.Producer(conf)
        failed: list = []
        stop = threading.Event()

        def poll() -> None:  # the router's client polls in a thread of its own too
            while not stop.is_set():
                producer.poll(0.02)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        written = []
        pad = "x" * 40
        for i in paced(rate, start, until):
            now = dt.datetime.now(dt.timezone.utc).isoformat()
            value = json.dumps({"op": "c", "after": {"id": i, "payload": pad},
                                "source": {"commit_time": now}}).encode()
            producer.produce(topic, value, key=str(i).encode(),
                             on_delivery=lambda err, msg: err and failed.append(err))
            written.append(i)
        producer.flush(30)
        stop.set()
        poller.join()
        out.send((written, repr(failed[0]) if failed else None))
    except BaseException as exc:
        out.send(([], repr(exc)))
    out.close()


def kafka_alone(args, settings: dict, topic: str) -> list[float] | None:
    """The ceiling's latencies (ms, sorted, warm-up left out), or None when it failed."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    consumer = Consumer(args.bootstrap, topic)
    consumer.start()
    try:
        ctx = multiprocessing.get_context("spawn")
        start = time.time() + 1.5  # the producer's process starts meanwhile
        until = start + args.seconds
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=kafka_alone_process, args=(
            args.bootstrap, topic, settings, args.rate, start, until, send))
        proc.start()
        send.close()
        written, error = recv.recv()
        proc.join()
        if error:
            print(f"Kafka alone: the producer failed: {error}")
            return None
        deadline = time.time() + 30
        while len(consumer.seen) < len(written) and time.time() < deadline \
                and consumer.error is None:
            time.sleep(0.1)
    finally:
        consumer.stop.set()
        consumer.join(10)
    warm = int(args.warmup * args.rate)
    if consumer.error or len(consumer.seen) < len(written):
        print(f"Kafka alone: {len(written) - len(consumer.seen)} of {len(written)} records "
              f"never arrived ({consumer.error!r})")
        return None
    return sorted(v * 1000 for k, v in consumer.seen.items() if k >= warm)


def pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=1000.0, help="transactions a second, total")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0, help="load duration")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds left out of the figures")
    ap.add_argument("--client", default="auto", choices=["auto", "librdkafka", "kafka-python"])
    ap.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                    help="a [kafka.settings] entry (TOML value), e.g. linger_ms=5")
    ap.add_argument("--ha", action="store_true",
                    help="[ha] enabled (one router: what the producer fence costs, docs/ha.md)")
    ap.add_argument("--transaction-interval-ms", type=int, default=None,
                    help="[kafka] transaction_interval_ms (exactly-once or --ha)")
    ap.add_argument("--no-ceiling", action="store_true",
                    help="skip Kafka alone (the same records produced without PostgreSQL and "
                         "the router)")
    ap.add_argument("--dsn", default=os.environ.get(
        "PGROUTER_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--bootstrap", default=os.environ.get("PGROUTER_TEST_KAFKA",
                                                          "127.0.0.1:9092"))
    ap.add_argument("--router-root", default=str(ROOT), metavar="DIR",
                    help="the checkout whose pgrouter run is measured (another commit's, to "
                         "compare; its C module built)")
    args = ap.parse_args()
    settings = dict(s.split("=", 1) for s in args.setting)
    tag = uuid.uuid4().hex[:8]
    table, pub, slot = f"lat_{tag}", f"lat_{tag}", f"lat_{tag}"
    prefix = f"bench.latency.{tag}"
    topic = f"{prefix}.rows"
    sql(args.dsn, f"create table {table} (id bigint primary key, payload text)",
        f"create publication {pub} for table {table}")
    router = None
    consumer = Consumer(args.bootstrap, topic)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = pathlib.Path(tmp) / "router.toml"
            cfg.write_text(config(args.dsn, args.bootstrap, slot, pub, table, args.client,
                                  topic, prefix, settings,
                                  "[ha]\nenabled = true\n" if args.ha else "",
                                  "" if args.transaction_interval_ms is None else
                                  f"transaction_interval_ms = {args.transaction_interval_ms}"))
            log = open(pathlib.Path(tmp) / "router.log", "w+")
            env = dict(os.environ, PYTHONPATH=args.router_root)
            router = subprocess.Popen([sys.executable, "-m", "actors.cli", "run", "-c", str(cfg)],
                                      cwd=args.router_root, stderr=log, stdout=log, env=env)
            # the first row creates the topic; the consumer starts once it exists
            deadline = time.time() + 60
            while not sql(args.dsn, "select 1 from pg_replication_slots where slot_name = "
                          f"'{slot}' and active", fetch=True):
                if router.poll() is not None or time.time() > deadline:
                    log.seek(0)
                    raise SystemExit(f"router did not start:\n{log.read()[-3000:]}")
                time.sleep(0.2)
            sql(args.dsn, f"insert into {table} values (-1, 'warm-up')")
            consumer.start()
            while -1 not in consumer.seen:
                if consumer.error or router.poll() is not None or time.time() > deadline:
                    log.seek(0)
                    raise SystemExit(f"first row never arrived ({consumer.error!r}):\n"
                                     f"{log.read()[-3000:]}")
                time.sleep(0.05)
            client_line = next((ln for ln in open(log.name) if "kafka_client=" in ln), "")
            client = client_line.split("kafka_client=")[1].split()[0] if client_line else "?"
            ctx = multiprocessing.get_context("spawn")
            start = time.time() + 1.0  # the writers' process starts meanwhile
            until = start + args.seconds
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=writers_process, args=(
                args.dsn, table, args.writers, args.rate, start, until, send))
            proc.start()
            send.close()
            written, error = recv.recv()
            proc.join()
            took = time.time() - start
            if error:
                raise SystemExit(f"writer failed: {error}")
            deadline = time.time() + 60
            while any(r not in consumer.seen for r in written[-200:]) or \
                    len(consumer.seen) < len(written) + 1:
                if time.time() > deadline or consumer.error:
                    break
                time.sleep(0.1)
            consumer.stop.set()
            consumer.join(10)
            missing = [r for r in written if r not in consumer.seen]
            warm = {w * 1_000_000_000 + i for w in range(args.writers)
                    for i in range(int(args.warmup * args.rate / args.writers))}
            lat = sorted(consumer.seen[r] * 1000 for r in written
                         if r in consumer.seen and r not in warm)
            cpu = cpu_of(router.pid)
            print(f"router {args.router_root}: {cpu:.1f} CPU s (user+sys, its whole run)")
            print(f"client {client}, {args.writers} writers, offered {args.rate:.0f} txn/s, "
                  f"achieved {len(written) / took:.0f} txn/s for {took:.1f} s "
                  f"({len(written)} rows; settings {settings or 'default'})")
            if lat:
                print(f"commit -> consumer latency (ms, after {args.warmup:.0f} s warm-up, "
                      f"{len(lat)} rows): p50 {pct(lat, 50):.1f}  p90 {pct(lat, 90):.1f}  "
                      f"p99 {pct(lat, 99):.1f}  max {lat[-1]:.1f}  "
                      f"mean {statistics.fmean(lat):.1f}")
                split = [consumer.split[r] for r in written
                         if r in consumer.split and r not in warm]
                for i, name in enumerate(("commit -> router's produce call",
                                          "produce call -> consumer")):
                    part = sorted(s[i] * 1000 for s in split)
                    if part:
                        print(f"  {name} (ms, record timestamps in ms): p50 "
                              f"{pct(part, 50):.1f}  p99 {pct(part, 99):.1f}  max {part[-1]:.1f}")
            if consumer.error:
                raise SystemExit(f"consumer failed: {consumer.error!r}")
            if missing:
                raise SystemExit(f"{len(missing)} of {len(written)} rows never arrived "
                                 f"(e.g. id {missing[0]})")
            print(f"every row arrived ({len(written)})")
            if not args.no_ceiling and client == "librdkafka":
                alone = kafka_alone(args, settings, f"{prefix}.alone")
                if alone:
                    print(f"Kafka alone (the router's producer settings, {len(alone)} records "
                          f"after the warm-up, no PostgreSQL, no router; ms): p50 "
                          f"{pct(alone, 50):.1f}  p90 {pct(alone, 90):.1f}  p99 "
                          f"{pct(alone, 99):.1f}  max {alone[-1]:.1f}  "
                          f"mean {statistics.fmean(alone):.1f}")
                    if lat:
                        print(f"router's share (end to end minus Kafka alone, ms): p50 "
                              f"{pct(lat, 50) - pct(alone, 50):+.1f}  p99 "
                              f"{pct(lat, 99) - pct(alone, 99):+.1f}  max "
                              f"{lat[-1] - alone[-1]:+.1f}")
    finally:
        consumer.stop.set()
        if router is not None and router.poll() is None:
            router.send_signal(signal.SIGTERM)
            try:
                router.wait(30)
            except subprocess.TimeoutExpired:
                router.kill()
                router.wait()
        try:
            # the walsender may outlive the router by a moment: drop once it lets go
            gone = time.time() + 15
            while time.time() < gone and sql(args.dsn, "select 1 from pg_replication_slots "
                                             f"where slot_name = '{slot}' and active",
                                             fetch=True):
                time.sleep(0.2)
            sql(args.dsn, "select pg_drop_replication_slot(slot_name) from "
                f"pg_replication_slots where slot_name = '{slot}'")
        finally:
            sql(args.dsn, f"drop publication if exists {pub}", f"drop table if exists {table}")
            delete_topics(args.bootstrap, [topic, f"{prefix}.schemas",
                                           f"{prefix}.definitions", f"{prefix}.alone",
                                           f"pgrouter.{slot}.leader"])


if __name__ == "__main__":
    main()
