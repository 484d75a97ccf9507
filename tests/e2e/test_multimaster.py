"""Multi-master through Kafka against the real stack: routers with origin policies, the
transaction topic, and ``pgrouter apply`` tagging what it applies with a replication origin.

* bidirectional A <-> B with ``origin = "none"``: concurrent writes on both nodes end up
  identical on both, every change is on the topics exactly once, and the system goes quiet;
* the same with ``origin = "any"``: the loop the policy prevents, bounded to two rounds;
* cascade A -> B -> C with B allowing A's origin (and a route overriding it with "none");
* ``kill -9`` of the applier mid-load: nothing applied twice, nothing lost.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import uuid

import psycopg2
import pytest
from kafka import KafkaConsumer, TopicPartition

from devstack.configs import toml
from devstack.process import query as sql

pytestmark = pytest.mark.services

ROOT = pathlib.Path(__file__).resolve().parents[2]
TABLE_DDL = ("create table t (id int primary key, v text, n int, doc text);"
             "alter table t alter column doc set storage external;"
             "create publication pub for table t;")
BIG = "x" * 5000  # stored out of line: updates that leave it alone send it as unchanged TOAST


# -- harness ----------------------------------------------------------------------------------

def rows(dsn: str) -> list[tuple]:
    return sql(dsn, "select id, v, n, md5(doc) from t order by id", fetch=True)


class Node:
    """One database on one dev-stack PostgreSQL, with its router and applier configs."""

    def __init__(self, node_db, node: str, name: str, tmp: pathlib.Path, kafka: str, tag: str):
        self.name = name
        self.server = node_db.nodes[node]
        self.dsn = node_db(node, name)
        self.tmp = tmp
        self.kafka = kafka
        self.prefix = f"mm{tag}{name}"
        self.topic = f"{self.prefix}.public.t"
        self.tx_topic = f"{self.prefix}.tx"
        self.origin_name = f"node_{name}_{tag}"  # what appliers *from* this node tag with
        self._register = node_db.origins
        sql(self.dsn, TABLE_DDL)
        # the slot exists before any write, so the router sees everything
        sql(self.dsn, "select pg_create_logical_replication_slot(%s, 'pgoutput')", self.prefix)

    def router_config(self, origin_toml: str, extra_routes: str = "") -> pathlib.Path:
        path = self.tmp / f"router-{self.name}.toml"
        path.write_text(f"""{origin_toml}
[source]
dsn = "{self.dsn}"
slot = "{self.prefix}"
publications = ["pub"]
create_slot = true
status_interval = 0.5
[kafka]
bootstrap_servers = "{self.kafka}"
transactions_topic = "{self.tx_topic}"
settings = {{ linger_ms = 1 }}
[[routes]]
name = "r"
tables = ["public.t"]
topic = "{self.prefix}.{{schema}}.{{table}}"
{extra_routes}
[log]
progress_interval = 60
""")
        return path

    def apply_config(self, source: "Node", conflict: str = "error",
                     group_rows: int = 1) -> pathlib.Path:
        """Applier config: ``source``'s topics into this node."""
        path = self.tmp / f"apply-{source.name}-to-{self.name}.toml"
        path.write_text(toml({
            "kafka": {"bootstrap_servers": self.kafka, "transactions_topic": source.tx_topic,
                      "topics": [f"{source.prefix}.public.*"], "poll_timeout": 0.1},
            "target": {"dsn": self.dsn, "origin": source.origin_name, "conflict": conflict,
                       "group_rows": group_rows},
            "log": {"progress_interval": 60}}))
        self._register.append((self.server, source.origin_name))
        return path


def until_caught_up(kind: str, cfg: pathlib.Path, timeout: float = 60) -> str:
    proc = subprocess.run([sys.executable, "-m", "actors.cli", kind, "-c", str(cfg),
                           "--until-caught-up"], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


class Processes:
    """Long-running routers/appliers; stopped (TERM, then KILL) at the end of the test."""

    def __init__(self, tmp: pathlib.Path):
        self.tmp = tmp
        self.procs: list[tuple[subprocess.Popen, pathlib.Path]] = []

    def start(self, kind: str, cfg: pathlib.Path) -> subprocess.Popen:
        logf = self.tmp / f"{cfg.stem}.{len(self.procs)}.log"
        proc = subprocess.Popen([sys.executable, "-m", "actors.cli", kind, "-c", str(cfg)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=open(logf, "w"))
        self.procs.append((proc, logf))
        return proc

    def check_alive(self) -> None:
        for proc, logf in self.procs:
            if proc.poll() is not None and proc.returncode not in (0, -9):
                raise AssertionError(f"{logf.name} exited {proc.returncode}:\n"
                                     f"{logf.read_text()[-3000:]}")

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def procs(tmp_path):
    p = Processes(tmp_path)
    yield p
    p.stop()


def read_topic(bootstrap: str, topic: str, timeout: float = 20) -> list[dict]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             group_id=None, allow_auto_create_topics=False)
    try:
        consumer.topics()
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            return []
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        out = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"reading {topic} timed out"
            for recs in consumer.poll(timeout_ms=200).values():
                out.extend(json.loads(r.value) for r in recs)
        return out
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topics: list[str]) -> dict:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             allow_auto_create_topics=False)
    try:
        consumer.topics()
        tps = [TopicPartition(t, p) for t in topics
               for p in (consumer.partitions_for_topic(t) or ())]
        return {f"{tp.topic}/{tp.partition}": o for tp, o in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def wait_for(cond, what: str, timeout: float, procs: Processes | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if procs is not None:
            procs.check_alive()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def workload(dsn: str, base: int, txns: int, pause: float = 0.0) -> int:
    """Inserts, updates (some leaving the TOASTed doc alone, some changing the key) and
    deletes on keys base+…; returns the number of row changes made."""
    conn = psycopg2.connect(dsn)
    changes = 0
    try:
        with conn.cursor() as cur:
            for i in range(txns):
                k = base + i
                cur.execute("insert into t values (%s, %s, 0, %s)", (k, f"v{k}", BIG + str(k)))
                changes += 1
                if i % 3 == 0:
                    cur.execute("update t set n = n + 1, v = v || '+' where id = %s", (k,))
                    changes += 1
                if i % 7 == 1:
                    cur.execute("update t set id = id + 50000, doc = doc || 'k' where id = %s",
                                (k,))
                    changes += 1
                if i % 5 == 2 and i > 10:
                    cur.execute("delete from t where id = %s", (k - 10,))
                    changes += cur.rowcount
                conn.commit()
                if pause:
                    time.sleep(pause)
    finally:
        conn.close()
    return changes


def local_changes(records: list[dict]) -> list[dict]:
    return [r for r in records if r["source"]["origin"] is None]


def positions(records: list[dict]) -> list[tuple]:
    return [(r["source"]["commit_lsn"], r["source"]["seq"]) for r in records]


# -- tests ------------------------------------------------------------------------------------

@pytest.mark.pg_matrix
def test_bidirectional_origin_none_no_echo(node_db, kafka_bootstrap, tmp_path, procs):
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    for n in (a, b):
        procs.start("run", n.router_config('origin = "none"'))
    procs.start("apply", b.apply_config(a))
    procs.start("apply", a.apply_config(b))
    counts = {}
    threads = [threading.Thread(target=lambda n=n, base=base: counts.__setitem__(
        n.name, workload(n.dsn, base, 150))) for n, base in ((a, 1), (b, 100_000))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    expected_rows = (sql(a.dsn, "select count(*) from t where id < 100000", fetch=True)[0][0]
                     + sql(b.dsn, "select count(*) from t where id >= 100000",
                           fetch=True)[0][0])  # disjoint keys
    wait_for(lambda: rows(a.dsn) == rows(b.dsn) and len(rows(a.dsn)) == expected_rows,
             "A and B to converge", 90, procs)

    # quiet: nothing more is written anywhere once the load stopped
    topics = [a.topic, a.tx_topic, b.topic, b.tx_topic]
    before = end_offsets(kafka_bootstrap, topics)
    time.sleep(3)
    assert end_offsets(kafka_bootstrap, topics) == before
    assert rows(a.dsn) == rows(b.dsn)

    # no echo: each node's topic holds its own changes, each exactly once, none replicated
    for n in (a, b):
        recs = read_topic(kafka_bootstrap, n.topic)
        assert local_changes(recs) == recs, f"{n.name}'s topic carries replicated changes"
        assert len(recs) == counts[n.name]
        assert len(set(positions(recs))) == len(recs)
        tx = read_topic(kafka_bootstrap, n.tx_topic)
        ends = [r for r in tx if r["status"] == "END"]
        assert sum(e["event_count"] for e in ends) == counts[n.name]
        assert len({e["id"] for e in ends}) == len(ends) == 150
    # the applied transactions are tagged: each target's origin reached the source's last commit
    last_a = max(r["source"]["commit_lsn"] for r in read_topic(kafka_bootstrap, a.topic))
    progress = sql(b.dsn, "select pg_replication_origin_progress(%s, true) - '0/0'::pg_lsn",
                   a.origin_name, fetch=True)[0][0]
    assert int(progress) == last_a


def test_origin_any_loops(node_db, kafka_bootstrap, tmp_path):
    """Without origin filtering a change goes round and round: bounded to two rounds here."""
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    ra, rb = a.router_config('origin = "any"'), b.router_config('origin = "any"')
    ab, ba = b.apply_config(a, "upsert"), a.apply_config(b, "upsert")
    sql(a.dsn, "insert into t values (1, 'one', 0, 'd')")
    sql(a.dsn, "update t set n = 1 where id = 1")
    seen = []
    for round_ in range(3):
        until_caught_up("run", ra)
        seen.append(read_topic(kafka_bootstrap, a.topic))
        if round_ == 2:
            break
        until_caught_up("apply", ab)
        until_caught_up("run", rb)
        until_caught_up("apply", ba)
    assert rows(a.dsn) == rows(b.dsn)
    # A's two changes; then the same two changes again, back from B; and again: the loop
    # never ends on its own
    assert [len(s) for s in seen] == [2, 4, 6]
    final = seen[-1]
    assert [r["source"]["origin"] for r in final] == [None, None] + [b.origin_name] * 4
    assert [r["after"]["n"] for r in final] == [0, 1] * 3
    assert len({r["source"]["commit_lsn"] for r in final}) == 6  # new transactions each round
    recs_b = read_topic(kafka_bootstrap, b.topic)
    assert {r["source"]["origin"] for r in recs_b} == {a.origin_name}
    assert len(recs_b) == 4


def test_cascade_a_to_b_to_c(node_db, kafka_bootstrap, tmp_path):
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg2", "b", tmp_path, kafka_bootstrap, tag)
    c = Node(node_db, "pg3", "c", tmp_path, kafka_bootstrap, tag)
    ra = a.router_config('origin = "none"')
    # B publishes its own changes and A's (not C's, say); route "local" overrides with none
    rb = b.router_config(f'[origin]\nallow = ["node_a_*"]\n', extra_routes=f"""
[[routes]]
name = "local"
tables = ["public.t"]
topic = "{b.prefix}.local.{{table}}"
origin = "none"
""")
    ab, bc = b.apply_config(a), c.apply_config(b)
    n_a = workload(a.dsn, 1, 40)
    n_b = workload(b.dsn, 100_000, 30)
    until_caught_up("run", ra)
    until_caught_up("apply", ab)
    until_caught_up("run", rb)
    until_caught_up("apply", bc)
    assert rows(c.dsn) == rows(b.dsn)
    assert {r[0] for r in rows(c.dsn)} == {r[0] for r in rows(a.dsn)} | {
        r[0] for r in rows(b.dsn) if r[0] >= 100_000}
    recs = read_topic(kafka_bootstrap, b.topic)
    by_origin = {}
    for r in recs:
        by_origin[r["source"]["origin"]] = by_origin.get(r["source"]["origin"], 0) + 1
    assert by_origin == {None: n_b, a.origin_name: n_a}  # none twice
    assert len(set(positions(recs))) == len(recs)
    local = read_topic(kafka_bootstrap, f"{b.prefix}.local.t")
    assert len(local) == n_b and local_changes(local) == local
    # C's changes came through B: tagged with B's origin on C
    assert sql(c.dsn, "select count(*) from pg_replication_origin where roname = %s",
               b.origin_name, fetch=True)[0][0] == 1


@pytest.mark.parametrize("group_rows", [1, 1000])
def test_applier_kill_9_exactly_once(node_db, kafka_bootstrap, tmp_path, procs, group_rows):
    """Killed mid-way and started again: every change applied once. With ``group_rows``
    source transactions share target transactions (the restart's backlog surely), each
    whole in one of them."""
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    sql(b.dsn, """
        create table audit (txid bigint default txid_current(), op text, id int);
        create function audit_t() returns trigger language plpgsql as $$
        begin
          insert into audit(op, id) values (tg_op, coalesce(new.id, old.id));
          return null;
        end $$;
        create trigger audit after insert or update or delete on t
          for each row execute function audit_t();""")
    procs.start("run", a.router_config('origin = "none"'))
    applier = procs.start("apply", b.apply_config(a, group_rows=group_rows))
    result = {}
    load = threading.Thread(target=lambda: result.__setitem__("n", workload(a.dsn, 1, 400, 0.02)))
    load.start()
    audit = lambda: sql(b.dsn, "select count(*) from audit", fetch=True)[0][0]  # noqa: E731
    wait_for(lambda: audit() >= 100, "the applier to be mid-way", 60, procs)
    applier.send_signal(signal.SIGKILL)
    applier.wait(timeout=10)
    killed_at = audit()
    assert load.is_alive(), "the load finished before the applier was killed"
    procs.start("apply", b.apply_config(a, group_rows=group_rows))
    load.join(timeout=120)
    total = result["n"]
    wait_for(lambda: rows(a.dsn) == rows(b.dsn), "B to catch up after the restart", 90, procs)
    time.sleep(1)
    assert killed_at < total
    assert audit() == total  # every row change applied once: none twice, none lost
    # and atomically: each source transaction is one target transaction, whole (or, grouped,
    # whole in one: no source transaction's changes in two target transactions)
    per_txn = sql(b.dsn, "select count(distinct txid) from audit", fetch=True)[0][0]
    if group_rows == 1:
        assert per_txn == 400
    else:
        assert per_txn < 400
        # a source transaction's insert and update of one key, in two target transactions
        split = sql(b.dsn, "select count(*) from audit i join audit u on u.id = i.id and "
                           "u.op = 'UPDATE' and u.txid <> i.txid where i.op = 'INSERT'",
                    fetch=True)[0][0]
        assert split == 0
