"""Helpers for tests against the real services: SQL, running the router, reading topics."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid

import psycopg2

ROOT = pathlib.Path(__file__).resolve().parent.parent


def config_head(dsn: str, kafka: str = "") -> str:
    """The ``[source]`` and ``[kafka]`` tables of a minimal router config, for tests that parse
    a config text and never connect; ``kafka``: lines added to ``[kafka]``. The caller
    appends the rest (more ``[kafka]`` keys, then ``[[routes]]``)."""
    return (f'[source]\ndsn = "{dsn}"\nslot = "s"\npublications = ["p"]\n'
            f'[kafka]\nbootstrap_servers = "k:9092"\n{kafka}')


#: a minimal ``pgrouter apply`` config text (tests parse it and never connect); ``[target]``
#: is last, so keys appended go there
APPLY_CONFIG = """
[kafka]
bootstrap_servers = "k:9092"
transactions_topic = "a.tx"
[target]
dsn = "postgresql://u@h/db"
origin = "node_a"
"""


def imported_modules(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Dotted names of what ``path`` imports, relative imports resolved from its place under
    ``root``; ``from pkg import name`` of a top-level package also gives ``pkg.name`` (the
    name may be a module). For the floor tests of ``router/`` and ``actors/``."""
    here = path.relative_to(root).with_suffix("").parts
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(here[:-node.level])
                names += ([".".join(base + [node.module])] if node.module else
                          [".".join(base + [a.name]) for a in node.names])
            elif node.module:
                names.append(node.module)
                if "." not in node.module:
                    names += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def wait_logged(what: str, cond, log: pathlib.Path, timeout: float, every: float = 0.2):
    """``cond()``'s first true value, polled every ``every`` seconds; past ``timeout`` fail
    naming ``what`` with the tail of the router's ``log``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-4000:]}")


def stop_router(proc: subprocess.Popen) -> None:
    """A started router stopped: SIGTERM (it drains), kill -9 after 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill9(proc)


def wait_line(line: str, log: pathlib.Path, proc: subprocess.Popen | None = None, *,
              timeout: float = 90, every: float = 0.2) -> None:
    """Until ``line`` is in a router's ``log``; fails with the log's tail past ``timeout`` or
    once ``proc`` (the router, if given) exited."""
    deadline = time.monotonic() + timeout
    while line not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        assert proc is None or proc.poll() is None, log.read_text()[-3000:]
        time.sleep(every)


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def database_dsn(dsn: str, db: str) -> str:
    """``dsn`` with database ``db`` (a test's own database on the same server)."""
    from urllib.parse import quote

    from psycopg2.extensions import parse_dsn

    d = parse_dsn(dsn)
    auth = quote(d.get("user", "postgres")) + (f":{quote(d['password'])}" if "password" in d
                                               else "")
    return f"postgresql://{auth}@{d.get('host', '127.0.0.1')}:{d.get('port', 5432)}/{db}"


class Pg:
    """An autocommit psycopg2 connection for test set-up and checks."""

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True

    def run(self, sql: str, *args):
        with self.conn.cursor() as cur:
            cur.execute(sql, args or None)
            return cur.fetchall() if cur.description else None

    def one(self, sql: str, *args):
        return self.run(sql, *args)[0][0]

    def close(self):
        self.conn.close()

    def pending_changes(self, slot: str, publication: str, timeout: float = 30) -> str:
        """The kinds of the row changes the slot still holds for ``publication`` (pgoutput's
        message bytes: "I", "U", "D", "T"), in order, peeked without consuming once nothing
        streams from it: what confirming the slot has not given up. A confirmation past a
        change (beyond any keepalive position, whatever else the server wrote meanwhile)
        shows as the change missing here."""
        deadline = time.monotonic() + timeout
        while self.one("select active from pg_replication_slots where slot_name = %s", slot):
            if time.monotonic() > deadline:
                raise AssertionError(f"slot {slot} still active after {timeout}s")
            time.sleep(0.2)
        rows = self.run("select substr(data, 1, 1) from pg_logical_slot_peek_binary_changes("
                        "%s, null, null, 'proto_version', '1', 'publication_names', %s)",
                        slot, publication)
        return "".join(k for (k,) in ((bytes(r[0]).decode(),) for r in rows) if k in "IUDT")

    def drop_slot(self, slot: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.run("select active from pg_replication_slots where slot_name = %s", slot)
            if not rows:
                return
            if not rows[0][0]:
                self.run("select pg_drop_replication_slot(%s)", slot)
                return
            time.sleep(0.2)
        raise AssertionError(f"slot {slot} still active after {timeout}s")


def write_config(path: pathlib.Path, *, dsn: str, slot: str, publications: list[str],
                 bootstrap: str, routes: str, extra: str = "", source_extra: str = "",
                 kafka_extra: str = "") -> pathlib.Path:
    pubs = ", ".join(json.dumps(p) for p in publications)
    path.write_text(f"""
[source]
dsn = {json.dumps(dsn)}
slot = {json.dumps(slot)}
publications = [{pubs}]
create_slot = true
status_interval = 0.5
{source_extra}

[kafka]
bootstrap_servers = {json.dumps(bootstrap)}
{kafka_extra}

[log]
progress_interval = 2

{routes}
{extra}
""")
    return path


def route_to_delta(tmp: pathlib.Path, *, dsn: str, bootstrap: str, name: str, table: str):
    """A router config (slot and publication ``name``, one route of ``public.<table>`` to the
    topic ``<name>.public.<table>``, schemas in ``<name>.schemas``) and the materializer's
    ``JobConfig`` for those topics: ``(router config path, JobConfig)``."""
    from actors.materialize import job

    router = write_config(tmp / "router.toml", dsn=dsn, slot=name, publications=[name],
                          bootstrap=bootstrap, kafka_extra=f'schema_topic = "{name}.schemas"',
                          routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{table}"]\n'
                                 f'topic = "{{route}}.{{schema}}.{{table}}"\n')
    return router, job.JobConfig(bootstrap_servers=bootstrap, topic_pattern=f"{name}\\.public\\..*",
                                 schema_topic=f"{name}.schemas", warehouse=str(tmp / "wh"),
                                 checkpoint=str(tmp / "ck"))


def router_cmd(config: pathlib.Path, *extra: str, module: str = "actors.cli") -> list[str]:
    return [sys.executable, "-m", module, "run", "-c", str(config), *extra]


def run_router(config: pathlib.Path, *, timeout: float = 120) -> subprocess.CompletedProcess:
    """``pgrouter run --until-caught-up``; fails the test on a non-zero exit."""
    proc = subprocess.run(router_cmd(config, "--until-caught-up"), capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, f"router exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc


def start_router(config: pathlib.Path, log: pathlib.Path, *,
                 module: str = "actors.cli") -> subprocess.Popen:
    """``pgrouter run`` in the background (``module``: another entry point with the same
    command line, such as a test's deliberately broken router)."""
    fh = open(log, "ab")
    proc = subprocess.Popen(router_cmd(config, module=module), stdout=fh, stderr=subprocess.STDOUT,
                            cwd=ROOT, start_new_session=True)
    STARTED.append(proc)
    return proc


#: every router ``start_router`` started, so one a failed test left running is killed at
#: that test's end (tests/conftest.py) instead of streaming on for the rest of the run
STARTED: list[subprocess.Popen] = []


def reap_started(since: int) -> None:
    """Kill the routers started after the first ``since`` that still run."""
    for proc in STARTED[since:]:
        if proc.poll() is None:
            kill9(proc)
    del STARTED[since:]


#: runs argv[1:] and prints its peak resident set (KiB) as the last line of stderr. A child
#: forked by a big process (a pytest worker) inherits that process's peak in ``ru_maxrss``
#: (the kernel records the old memory's high-water mark at the exec), so the command is
#: started from this small launcher instead, whose own peak is a few MiB
_PEAK_LAUNCHER = ("import resource, subprocess, sys\n"
                  "code = subprocess.run(sys.argv[1:]).returncode\n"
                  "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
                  "print(f'peak-rss-kib {peak}', file=sys.stderr)\n"
                  "sys.exit(code)\n")


def peak_rss(cmd: list[str], *, timeout: float = 300) -> tuple[int, int, str]:
    """(peak RSS in bytes, exit code, stderr) of ``cmd`` run to its end."""
    err_path = ROOT / ".devstack" / f"peak-{os.getpid()}-{time.monotonic_ns()}.log"
    try:
        with open(err_path, "w+b") as err:
            proc = subprocess.Popen([sys.executable, "-c", _PEAK_LAUNCHER, *cmd], cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=err)
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise AssertionError(f"timed out: {cmd}") from None
            err.seek(0)
            text = err.read().decode(errors="replace")
    finally:
        err_path.unlink(missing_ok=True)
    body, _, last = text.rstrip("\n").rpartition("\n")
    assert last.startswith("peak-rss-kib "), text[-3000:]
    return int(last.split()[1]) * 1024, code, body


def kill9(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def drop_source(pg: "Pg", name: str, bootstrap: str, topics: tuple[str, ...] = ()) -> None:
    """What a test made, all named ``name``: its slot, publication and table, closing ``pg``;
    then ``topics`` that exist are deleted."""
    pg.drop_slot(name)
    pg.run(f"drop publication if exists {name}")
    pg.run(f"drop table if exists {name}")
    pg.close()
    from devstack.kafka import delete_topics

    delete_topics(bootstrap, topics, client_id="pgrouter-test")


def read_topic(bootstrap: str, topic: str, *, timeout: float = 60,
               missing_ok: bool = False, decode: bool = True,
               settle: float = 5) -> list[dict]:
    """Every record of ``topic`` (all partitions) up to its end offsets at call time, by
    partition and offset, as dicts with key, value (decoded JSON), headers, partition,
    offset, timestamp (ms) and timestamp_type (1: the broker's append time);
    ``decode=False``: key and value as bytes (Avro). A topic that does not exist fails the test
    (a wrong name must not read as "no records") unless ``missing_ok``: then it has none.
    A topic not there yet is waited for up to ``settle`` seconds (one being created may
    briefly report no partitions); ``settle=0`` when whatever could make it has finished
    (``run_router`` returned): then its absence is final and is not waited out."""
    try:
        import confluent_kafka  # noqa: F401  (librdkafka: about twice as fast on big topics)
    except ImportError:
        return _read_topic_kafka_python(bootstrap, topic, timeout=timeout,
                                        missing_ok=missing_ok, decode=decode, settle=settle)
    return _read_topic_librdkafka(bootstrap, topic, timeout=timeout, missing_ok=missing_ok,
                                  decode=decode, settle=settle)


def _record(key, value, headers, partition: int, offset: int, timestamp: int,
            timestamp_type, decode: bool) -> dict:
    load = json.loads if decode else (lambda b: b)
    return {"key": load(key) if key else None, "value": load(value),
            "headers": dict(headers or ()), "partition": partition, "offset": offset,
            "timestamp": timestamp, "timestamp_type": timestamp_type, "raw": (key, value)}


def _position(record: dict) -> tuple[int, int]:
    return record["partition"], record["offset"]


def _missing(topic: str, missing_ok: bool) -> list:
    if missing_ok:
        return []
    raise AssertionError(f"topic {topic} does not exist (missing_ok=True when none may be made)")


def assign_from_beginning(consumer, topic: str, settle: float):
    """``topic``'s partitions that hold records, assigned to ``consumer`` (confluent-kafka)
    from their beginning, the topic waited for up to ``settle`` seconds: (each partition's
    (low, high) watermarks at call time, the partitions to read), or None when it does not
    exist."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    settle_end = time.monotonic() + settle

    def partitions() -> list[int]:
        meta = consumer.list_topics(timeout=10).topics.get(topic)
        return sorted(meta.partitions) if meta is not None and meta.error is None else []

    parts = partitions()
    while not parts and time.monotonic() < settle_end:
        time.sleep(0.2)
        parts = partitions()
    if not parts:
        return None
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            for p in parts}
    todo = {p for p, (low, high) in ends.items() if high > low}
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(todo)])
    return ends, todo


def _read_topic_librdkafka(bootstrap: str, topic: str, *, timeout: float, missing_ok: bool,
                           decode: bool, settle: float) -> list[dict]:
    """``read_topic`` with confluent-kafka: read_uncommitted like kafka-python's default, each
    partition up to its high watermark at call time (a partition whose last offsets are
    transaction markers ends at its end-of-partition event)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("read-topic"),
                         "enable.auto.commit": False, "isolation.level": "read_uncommitted",
                         "enable.partition.eof": True, "auto.offset.reset": "earliest",
                         "fetch.wait.max.ms": 10})  # an end of control records: no 0.5 s wait
    try:
        deadline = time.monotonic() + timeout
        assigned = assign_from_beginning(consumer, topic, settle)
        if assigned is None:
            return _missing(topic, missing_ok)
        ends, todo = assigned
        out = []
        while todo:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out reading {topic}")
            for m in consumer.consume(10_000, 0.05):  # waits this long unless it has 10k
                p, offset, end = m.partition(), m.offset(), ends[m.partition()][1]
                if m.error() is not None:
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(m.error())
                    if offset >= end:
                        todo.discard(p)
                    continue
                if offset < end:
                    ts_type, ts = m.timestamp()
                    out.append(_record(m.key(), m.value(), m.headers(), p, offset, ts,
                                       {1: 0, 2: 1}.get(ts_type), decode))
                if offset >= end - 1:
                    todo.discard(p)
        out.sort(key=_position)  # the same order every read (tests zip two reads)
        return out
    finally:
        consumer.close()


def _read_topic_kafka_python(bootstrap: str, topic: str, *, timeout: float, missing_ok: bool,
                             decode: bool, settle: float) -> list[dict]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=1000)
    try:
        # a topic the router has not created yet has no records; one being created may
        # briefly report no partitions
        parts = consumer.partitions_for_topic(topic)
        deadline = time.monotonic() + timeout
        settle_end = time.monotonic() + settle
        while not parts and time.monotonic() < settle_end:
            time.sleep(0.2)
            consumer.topics()
            parts = consumer.partitions_for_topic(topic)
        if not parts:
            return _missing(topic, missing_ok)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out reading {topic}")
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                for m in msgs:
                    if m.offset < ends[tp]:
                        out.append(_record(m.key, m.value, m.headers, m.partition, m.offset,
                                           m.timestamp, m.timestamp_type, decode))
        out.sort(key=_position)
        return out
    finally:
        consumer.close()


def pg_text(v):
    """A JSON value from an envelope as PostgreSQL's ``::text`` prints it (for comparing
    topics with ``SELECT col::text``)."""
    if v is True:
        return "true"
    if v is False:
        return "false"
    return None if v is None else str(v)


def topic_rows(bootstrap: str, topic: str, key: list[str], columns: list[str]) -> set:
    """The rows a consumer folding ``topic`` holds, each as PostgreSQL's text of ``columns``."""
    folded = fold_rows(read_topic(bootstrap, topic), key)
    return {tuple(pg_text(row.get(c)) for c in columns) for row in folded.values()}


def table_rows(conn, table: str, columns: list[str]) -> set:
    """A table's rows as PostgreSQL's text of ``columns`` (to compare with ``topic_rows``)."""
    with conn.cursor() as cur:
        cur.execute(f"select {', '.join(f'{c}::text' for c in columns)} from {table}")
        return set(cur.fetchall())


def fold_rows(records: list[dict], key_columns: list[str]) -> dict:
    """Apply change records in position order to a dict key -> row (what a consumer that
    materializes the topic would hold)."""
    rows: dict = {}
    ordered = sorted(records, key=lambda r: (r["value"]["source"]["commit_lsn"],
                                             r["value"]["source"]["seq"]))
    for r in ordered:
        v = r["value"]
        op = v["op"]
        if op == "t":
            rows.clear()
        elif op in ("c", "r", "u"):
            if v["before"] is not None:
                old_key = tuple(v["before"][k] for k in key_columns)
                rows.pop(old_key, None)
            after = dict(v["after"])
            new_key = tuple(after[k] for k in key_columns)
            prev = rows.get(new_key, {})
            for col in v.get("unchanged_toast", []):
                after[col] = prev.get(col)
            rows[new_key] = after
        elif op == "d":
            rows.pop(tuple(v["before"][k] for k in key_columns), None)
    return rows
