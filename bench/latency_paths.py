"""The two paths ``bench/latency.py`` measures next to the router: Kafka alone and PostgreSQL's
own path alone (``pg_recvlogical``), plus the writers and the pacing they share."""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import subprocess
import threading
import uuid
import time

import psycopg2

from bench.e2e import pg_recvlogical, sql

#: row ids of a writer: ``wid * WRITER_IDS + i``
WRITER_IDS = 1_000_000_000


def parse_iso(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


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


def writer(dsn: str, table: str, wid: int, base: int, rate: float, start: float,
           until: float, written: list, errors: list) -> None:
    """One row per transaction at ``rate`` a second from ``start`` to ``until``."""
    try:
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        cur = conn.cursor()
        for i in paced(rate, start, until):
            rid = wid * WRITER_IDS + base + i
            cur.execute(f"insert into {table} values (%s, %s)", (rid, "x" * 40))
            written.append(rid)
        conn.close()
    except BaseException as exc:
        errors.append(exc)


def writers_process(dsn: str, table: str, writers: int, base: int, rate: float, start: float,
                    until: float, out) -> None:
    """The writers' process (apart from the consumer's, so neither waits for the other's
    GIL): one thread per writer; sends back the ids written and the first error."""
    written: list[int] = []
    errors: list = []
    threads = [threading.Thread(target=writer, args=(
        dsn, table, w, base, rate / writers, start + w / rate, until, written, errors))
        for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.send((written, repr(errors[0]) if errors else None))
    out.close()


def write(args, table: str, base: int) -> tuple[list[int], float, float]:
    """The writers' load (``args.rate`` for ``args.seconds``) from a process of their own:
    (ids written, start time, seconds taken)."""
    ctx = multiprocessing.get_context("spawn")
    start = time.time() + 1.0  # the writers' process starts meanwhile
    until = start + args.seconds
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=writers_process, args=(
        args.dsn, table, args.writers, base, args.rate, start, until, send))
    proc.start()
    send.close()
    written, error = recv.recv()
    proc.join()
    if error:
        raise SystemExit(f"writer failed: {error}")
    return written, start, time.time() - start


class Consumer(threading.Thread):
    """Reads the topic from its beginning; ``seen`` maps row id -> latency in seconds."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.seen: dict[int, float] = {}
        self.at: dict[int, float] = {}  # row id -> when the consumer had it (wall clock)
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
            self.at[after["id"]] = now
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


def kafka_alone_process(bootstrap: str, topic: str, settings: dict, rate: float,
                        start: float, until: float, out) -> None:
    """The ceiling's producer: records shaped like the router's (an ``after`` with the id,
    ``source.commit_time`` = the moment the record is handed over), one at a time at
    ``rate`` (open loop), produced with the router's librdkafka settings."""
    try:
        import confluent_kafka as ck

        from actors.kafka.librdkafka import DEFAULTS
        from router.config.kafka_settings import LIBRDKAFKA, translate

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


def kafka_alone(args, settings: dict, topic: str, consumer_class) -> dict[int, float] | None:
    """Kafka alone's latencies (id -> seconds, from when the producer is handed the record),
    or None when it failed. ``args.warmup`` seconds of ids are left out."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    consumer = consumer_class(args.bootstrap, topic)
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
    if consumer.error or len(consumer.seen) < len(written):
        print(f"Kafka alone: {len(written) - len(consumer.seen)} of {len(written)} records "
              f"never arrived ({consumer.error!r})")
        return None
    warm = int(args.warmup * args.rate)
    consumer.at = {k: v for k, v in consumer.at.items() if k >= warm}
    return {k: v for k, v in consumer.seen.items() if k >= warm}


class RecvLogical(threading.Thread):
    """``pg_recvlogical`` of the server's version on a ``test_decoding`` slot with
    ``include-timestamp``, its output read line by line as it comes: for every row id the
    time from its transaction's commit (the COMMIT line's timestamp, the server's clock) to
    the moment its COMMIT line is read here."""

    def __init__(self, dsn: str, slot: str):
        super().__init__(daemon=True)
        self.seen: dict[int, float] = {}
        self.at: dict[int, float] = {}
        self.error: BaseException | None = None
        self.proc = subprocess.Popen(
            [pg_recvlogical(dsn), "-d", dsn, "--slot", slot, "--start", "--no-loop",
             "-o", "include-timestamp=1", "-o", "skip-empty-xacts=1", "-f", "-"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def run(self) -> None:
        try:
            ids: list[int] = []
            for raw in self.proc.stdout:  # written by pg_recvlogical message by message
                now = time.time()
                line = raw.decode()
                if line.startswith("table "):
                    at = line.find(" id[bigint]:")
                    if at >= 0:
                        ids.append(int(line[at + 12:].split(" ", 1)[0]))
                elif line.startswith("COMMIT"):
                    committed = parse_iso(line[line.index("(at ") + 4:line.rindex(")")])
                    for rid in ids:
                        self.seen[rid] = now - committed
                        self.at[rid] = now
                    ids = []
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.join(10)


def postgres_alone(args, table: str, slot: str, base: int) -> tuple[dict, dict] | None:
    """The same load committed with no router: (id -> seconds, id -> arrival time) read by
    ``pg_recvlogical`` on a ``test_decoding`` slot of its own (created here, dropped after)."""
    sql(args.dsn, f"select pg_create_logical_replication_slot('{slot}', 'test_decoding')")
    reader = RecvLogical(args.dsn, slot)
    try:
        reader.start()
        written, _, _ = write(args, table, base)
        deadline = time.time() + 30
        while any(r not in reader.seen for r in written[-50:]) and time.time() < deadline \
                and reader.error is None:
            time.sleep(0.1)
    finally:
        reader.stop()
        drop_slot(args.dsn, slot)
    missing = [r for r in written if r not in reader.seen]
    if reader.error or missing:
        err = reader.proc.stderr.read().decode()[-500:] if reader.proc.stderr else ""
        print(f"PostgreSQL alone: {len(missing)} of {len(written)} rows never read "
              f"({reader.error!r}) {err}")
        return None
    warm = warm_ids(args, base)
    return ({r: reader.seen[r] for r in written if r not in warm},
            {r: reader.at[r] for r in written if r not in warm})


def drop_slot(dsn: str, slot: str) -> None:
    # the walsender may outlive its reader by a moment: drop once it lets go
    gone = time.time() + 15
    while time.time() < gone and sql(dsn, "select 1 from pg_replication_slots where "
                                     f"slot_name = '{slot}' and active", fetch=True):
        time.sleep(0.2)
    sql(dsn, "select pg_drop_replication_slot(slot_name) from pg_replication_slots "
        f"where slot_name = '{slot}'")


def warm_ids(args, base: int) -> set[int]:
    """The ids the writers write in the first ``args.warmup`` seconds."""
    return {w * WRITER_IDS + base + i for w in range(args.writers)
            for i in range(int(args.warmup * args.rate / args.writers))}
