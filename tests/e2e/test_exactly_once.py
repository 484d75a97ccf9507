"""Exactly-once into Kafka (``[kafka] exactly_once = true``) on the real stack.

* Every change reaches a ``read_committed`` consumer once, in order per key, across repeated
  ``kill -9`` of the router; right after each kill, every source transaction committed below
  the slot's ``confirmed_flush_lsn`` is already visible to ``read_committed`` consumers (the
  slot never confirms past what Kafka committed). The oracle is a ``test_decoding`` slot.
* A second slot on a transactional id that holds another slot's progress is refused (the
  running router is not fenced); one slot name on two servers keeps two progress records.
* A second router on the same config waits for the slot; it does not fence the first.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import threading
import time

import psycopg2
import pytest

from tests.e2e.guarantee import ConfirmSampler
from tests.e2e.sources import drop_made, new_table
from tests.helpers import (Pg, assign_from_beginning, kill9, run_router, start_router, unique,
                           write_config)

pytestmark = pytest.mark.services

ROWS = int(os.environ.get("PGROUTER_EO_ROWS", "20000"))
BATCH = 100
PACE = 0.05  # seconds between batches: the load spans the kills
HOT = 10  # keys updated by every batch: their counters must arrive in order, once each
CLIENTS = ["kafka-python", "librdkafka"]


def read_committed(bootstrap: str, topic: str, *, timeout: float = 120) -> list:
    """Every record a read_committed consumer sees in ``topic``, up to the last stable
    offsets (each partition's end-of-partition event; never past the high watermark at call
    time): (partition, key, value) in partition order. librdkafka: the polling loops below
    read the whole topic again and again, about twice as fast as with kafka-python."""
    from confluent_kafka import Consumer, KafkaError, KafkaException

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("read-committed"),
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True, "fetch.wait.max.ms": 10})
    try:
        deadline = time.monotonic() + timeout
        assigned = assign_from_beginning(consumer, topic, settle=5)
        if assigned is None:  # not created yet: nothing committed
            return []
        ends, todo = assigned
        out = []
        while todo:
            assert time.monotonic() < deadline, f"timed out reading {topic}"
            for m in consumer.consume(10_000, 0.05):
                p, offset = m.partition(), m.offset()
                if m.error() is not None:
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(m.error())
                    todo.discard(p)
                elif offset < ends[p][1]:
                    out.append((p, m.key(), m.value()))
                if offset >= ends[p][1] - 1:
                    todo.discard(p)
        out.sort(key=lambda r: r[0])  # stable: each partition's records stay in order
        return out
    finally:
        consumer.close()


def changes(bootstrap: str, topic: str) -> list[dict]:
    return [json.loads(v) for _, _, v in read_committed(bootstrap, topic)]


def parse_lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


class Load(threading.Thread):
    """Batches of BATCH inserts, each also bumping the counter of every hot key: ``rows``
    of them, or fewer when ``stop()`` ends the load first (``batches``: how many were
    committed)."""

    def __init__(self, dsn: str, table: str, rows: int):
        super().__init__(daemon=True)
        self.dsn, self.table, self.rows = dsn, table, rows
        self.error: BaseException | None = None
        self.batches = 0
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self):
        try:
            conn = psycopg2.connect(self.dsn)
            with conn.cursor() as cur:
                for batch in range(self.rows // BATCH):
                    if self._halt.is_set():
                        break
                    lo = HOT + batch * BATCH
                    cur.execute(f"insert into {self.table} (id, n, payload) select g, 0, "
                                f"md5(g::text) from generate_series(%s, %s) g",
                                (lo, lo + BATCH - 1))
                    cur.execute(f"update {self.table} set n = n + 1 where id < %s", (HOT,))
                    conn.commit()
                    self.batches = batch + 1
                    time.sleep(PACE)
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def oracle(pg: Pg, slot: str, table: str) -> list[tuple[int, set[int]]]:
    """(commit LSN, ids inserted into ``table``) of every committed transaction, from
    test_decoding (other tests write other tables of the database meanwhile)."""
    txns, ids = [], set()
    prefix = f"table public.{table}: INSERT"
    for lsn, data in pg.run("select lsn::text, data from "
                            "pg_logical_slot_peek_changes(%s, null, null)", slot):
        if data.startswith("BEGIN"):
            ids = set()
        elif data.startswith(prefix):
            ids.add(int(re.search(r"id\[bigint\]:(\d+)", data).group(1)))
        elif data.startswith("COMMIT"):
            txns.append((parse_lsn(lsn), ids))
    return txns


@pytest.fixture
def table(pg_dsn, kafka_bootstrap, tmp_path, request):
    pg, name = new_table(pg_dsn, "eo", "id bigint primary key, n int, payload text")
    pg.run(f"insert into {name} select g, 0, 'hot' from generate_series(0, {HOT - 1}) g")
    pg.run(f"create publication {name} for table {name}")
    made = [name]

    def config(client: str, *, slot: str | None = None, tid: str = "") -> "os.PathLike":
        slot = slot or name
        made.append(slot)
        path = write_config(
            tmp_path / f"{slot}-{client}.toml", dsn=pg_dsn, slot=slot, publications=[name],
            bootstrap=kafka_bootstrap,
            kafka_extra=(f'client = "{client}"\nexactly_once = true\n'
                         f'committed_lsn_topic = "{name}.progress"\n'
                         + (f'transactional_id = "{tid}"\n' if tid else "")),
            routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                   f'topic = "{name}"\ntopic_settings = {{ partitions = 3 }}\n')
        # the slot is confirmed seconds after the Kafka commit: kills land in between, and
        # the restarted router must skip what Kafka already holds
        path.write_text(path.read_text().replace("status_interval = 0.5",
                                                 "status_interval = 3"))
        return path

    yield pg, name, config
    for slot in set(made[1:]) | {f"{name}_oracle"}:
        pg.drop_slot(slot)
    pg.run(f"drop publication {name}")
    pg.run(f"drop table {name}")
    pg.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_kill9_leaves_each_change_once_for_read_committed(table, kafka_bootstrap, tmp_path,
                                                          client):
    pg, name, config = table
    cfg = config(client)
    run_router(cfg)  # the slot exists before the load
    pg.run("select pg_create_logical_replication_slot(%s, 'test_decoding')", f"{name}_oracle")
    # writes until the four kills are done (a slow start must not find the load over)
    load = Load(pg.dsn, name, 50 * ROWS)
    load.start()
    rng = random.Random(18)
    samples = []
    seen = 0
    for i in range(4):
        log = tmp_path / f"router-{i}.log"
        proc = start_router(cfg, log)
        # placed by observed progress: this run has committed new changes to Kafka
        deadline = time.monotonic() + 120
        while len(changes(kafka_bootstrap, name)) < seen + 300:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(rng.uniform(0.0, 1.0))
        assert proc.poll() is None, log.read_text()[-3000:]
        kill9(proc)
        deadline = time.monotonic() + 30
        while pg.one("select active from pg_replication_slots where slot_name = %s", name):
            assert time.monotonic() < deadline, "slot stayed active after the kill"
            time.sleep(0.2)
        confirmed = parse_lsn(pg.one("select confirmed_flush_lsn::text from "
                                     "pg_replication_slots where slot_name = %s", name))
        now = changes(kafka_bootstrap, name)
        seen = len(now)
        in_kafka = {c["after"]["id"] for c in now if c["op"] == "c"}
        samples.append((confirmed, in_kafka))
    load.stop()
    load.join(timeout=300)
    assert not load.is_alive() and load.error is None, f"load failed: {load.error!r}"
    batches = load.batches
    run_router(cfg, timeout=300)

    records = changes(kafka_bootstrap, name)
    positions = [(r["source"]["commit_lsn"], r["source"]["seq"]) for r in records]
    assert len(positions) == len(set(positions)), "a change reached read_committed twice"
    inserted = [r["after"]["id"] for r in records if r["op"] == "c"]
    assert sorted(inserted) == list(range(HOT, HOT + batches * BATCH))
    for key in range(HOT):  # per key: the counter goes 1, 2, 3 … with no repeat or gap
        counts = [r["after"]["n"] for r in records if r["op"] == "u" and r["after"]["id"] == key]
        assert counts == list(range(1, batches + 1)), f"key {key}: {counts[:20]}…"
    txns = oracle(pg, f"{name}_oracle", name)
    for confirmed, in_kafka in samples:
        unsafe = [lsn for lsn, ids in txns if lsn < confirmed and not ids <= in_kafka]
        assert not unsafe, (f"confirmed_flush_lsn {confirmed:X} passed {len(unsafe)} "
                            "transactions not committed in Kafka")
    assert any(s[1] for s in samples), "no kill happened while data was flowing"


@pytest.mark.parametrize("client", CLIENTS)
def test_restart_behind_kafka_skips_what_kafka_already_holds(table, kafka_bootstrap, client):
    """The slot confirmed less than Kafka committed (a crash between the Kafka commit and
    the standby status): PostgreSQL resends those transactions, the router skips them."""
    pg, name, config = table
    tid = f"{name}-tid"
    cfg = config(client, tid=tid)
    run_router(cfg)
    # a copy of the slot at this position; after the router moved on, the slot is put back
    # to it (the same stream: slot name, database, server), with Kafka's progress ahead
    pg.run("select pg_copy_logical_replication_slot(%s, %s)", name, f"{name}_behind")
    for i in range(3):
        pg.run(f"update {name} set n = n + 1 where id < 3")
    run_router(cfg)
    pg.drop_slot(name)
    pg.run("select pg_copy_logical_replication_slot(%s, %s)", f"{name}_behind", name)
    pg.drop_slot(f"{name}_behind")
    proc = run_router(cfg)  # the same three transactions again, from the slot put back
    pg.run(f"update {name} set n = n + 10 where id = 0")
    run_router(cfg)
    updates = [(r["after"]["id"], r["after"]["n"]) for r in changes(kafka_bootstrap, name)
               if r["op"] == "u"]
    assert sorted(updates) == sorted([(k, n) for k in range(3) for n in (1, 2, 3)] + [(0, 13)])
    assert "skipping source transactions Kafka already holds" in proc.stderr


def wait_for_line(log, text: str, proc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)


def test_a_second_slot_on_the_same_transactional_id_is_refused(table, tmp_path):
    """Two slots on one transactional id would skip each other's transactions (the progress
    of one taken for the other's): the second is refused with one line, before it registers
    the id (so the running router is not fenced) and before it creates its slot."""
    pg, name, config = table
    first = config("librdkafka", tid=f"{name}-tid")
    second = config("kafka-python", slot=f"{name}_b", tid=f"{name}-tid")
    run_router(first)  # the slot
    pg.run(f"update {name} set n = n + 1 where id = 0")
    run_router(first)  # Kafka holds progress of the first slot under the id
    log = tmp_path / "first.log"
    proc = start_router(first, log)
    try:
        wait_for_line(log, "streaming started", proc)
        pg.run(f"update {name} set n = n + 1 where id = 2")
        with pytest.raises(AssertionError) as info:
            run_router(second)
        assert not pg.run("select 1 from pg_replication_slots where slot_name = %s",
                          f"{name}_b"), "a refused start created its slot"
        text = str(info.value)
        assert "transactional id" in text and f"slot '{name}_b'" in text, text
        assert f"holds the committed LSN of slot '{name}'" in text, text
        assert "Traceback" not in text
        pg.run(f"update {name} set n = n + 1 where id = 1")
        time.sleep(2)
        assert proc.poll() is None, log.read_text()[-3000:]  # not fenced
    finally:
        kill9(proc)
    assert "fenced" not in log.read_text()


def updates_of(bootstrap: str, topic: str, key: int) -> list[int]:
    return [r["after"]["n"] for r in changes(bootstrap, topic)
            if r["op"] == "u" and r["after"]["id"] == key]


def first_update_delivered(pg: Pg, bootstrap: str, name: str, key: int, proc, log,
                           timeout: float) -> None:
    """Updates row ``key`` (never updated before) and waits for its change in the topic,
    ``proc`` (the router streaming it, writing ``log``) alive all along."""
    pg.run(f"update {name} set n = n + 1 where id = {key}")
    deadline = time.monotonic() + timeout
    while updates_of(bootstrap, name, key) != [1]:
        assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.3)


def test_a_second_router_on_the_same_config_waits_for_the_slot(table, kafka_bootstrap,
                                                               tmp_path):
    """A second `pgrouter run` on the same config (no [ha]): the slot is held by the first,
    so the second waits for it instead of fencing the first (which would stop both: the
    first fenced, the second refusing the first's newest progress as past the WAL end it
    had read). The first keeps streaming; once it stops, the second takes over; every
    change reaches read_committed consumers once."""
    pg, name, config = table
    cfg = config("librdkafka")
    run_router(cfg)  # the slot
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    procs = [start_router(cfg, logs[0])]
    try:
        wait_for_line(logs[0], "streaming started", procs[0])
        pg.run(f"update {name} set n = n + 1 where id = 1")
        procs.append(start_router(cfg, logs[1]))
        # the second waits up to 30 s (``SLOT_BUSY_WAIT``) for the slot: what follows fits
        wait_for_line(logs[1], "waiting for the slot", procs[1])
        assert procs[0].poll() is None, logs[0].read_text()[-3000:]
        for _ in range(5):  # the first goes on committing while the second waits
            pg.run(f"update {name} set n = n + 1 where id = 1")
            time.sleep(0.2)
        deadline = time.monotonic() + 20
        while updates_of(kafka_bootstrap, name, 1) != list(range(1, 7)):
            assert time.monotonic() < deadline, (updates_of(kafka_bootstrap, name, 1),
                                                 [log.read_text()[-1500:] for log in logs])
            time.sleep(0.3)
        for proc, log in zip(procs, logs):
            assert proc.poll() is None, log.read_text()[-3000:]
        os.killpg(procs[0].pid, signal.SIGTERM)  # the first drains and stops
        assert procs[0].wait(timeout=30) == 0, logs[0].read_text()[-3000:]
        wait_for_line(logs[1], "streaming started", procs[1], timeout=30)
        first_update_delivered(pg, kafka_bootstrap, name, 2, procs[1], logs[1], timeout=60)
    finally:
        for proc in procs:
            kill9(proc)
    text = logs[0].read_text() + logs[1].read_text()
    assert "fenced" not in text and "past the server's WAL end" not in text, text[-3000:]
    assert updates_of(kafka_bootstrap, name, 1) == list(range(1, 7))


def test_same_slot_name_on_two_servers_keeps_each_servers_progress(node_db, kafka_bootstrap,
                                                                   tmp_path):
    """Two servers, one slot name, one Kafka and one progress topic: each router keeps its
    own progress (the default transactional id names the stream) and delivers every row of
    its own server, whichever server's WAL is further ahead."""
    u = unique("eos")
    dsns = [node_db("pg", "eos"), node_db("pg2", "eos")]
    pgs = [Pg(d) for d in dsns]
    try:
        for pg in pgs:
            pg.run("create table t (id bigint primary key, n int, payload text)")
            pg.run("create publication p for table t")
        # the first server's WAL is well ahead of the second's
        while (parse_lsn(pgs[0].one("select pg_current_wal_lsn()::text"))
               <= parse_lsn(pgs[1].one("select pg_current_wal_lsn()::text")) + (1 << 24)):
            pgs[0].run("insert into t values (-1, 0, '') on conflict (id) do update "
                       "set n = t.n + 1; select pg_switch_wal()")
        cfgs = [write_config(tmp_path / f"s{i}.toml", dsn=dsn, slot=f"{u}_slot",
                             publications=["p"], bootstrap=kafka_bootstrap,
                             kafka_extra=f'exactly_once = true\ncommitted_lsn_topic = "{u}.progress"\n',
                             routes=f'[[routes]]\nname = "r"\ntables = ["public.t"]\n'
                                    f'topic = "{u}.s{i}"\n')
                for i, dsn in enumerate(dsns)]
        for cfg in cfgs:
            run_router(cfg)  # the slots exist from here on
        for i, pg in enumerate(pgs):
            pg.run(f"insert into t select g, {i}, 'x' from generate_series(1, 100) g")
            run_router(cfgs[i])
        for i in range(2):
            ids = sorted(v["after"]["id"] for v in changes(kafka_bootstrap, f"{u}.s{i}")
                         if v["after"]["id"] > 0)
            assert ids == list(range(1, 101)), (i, len(ids))
    finally:
        for pg in pgs:
            pg.close()


def test_non_transactional_message_after_a_commit_is_not_skipped(table, kafka_bootstrap,
                                                                  tmp_path):
    """A non-transactional logical message has no end LSN: it is never taken for something
    an earlier run committed."""
    pg, name, config = table
    cfg = config("librdkafka")
    cfg.write_text(cfg.read_text().replace("exactly_once = true",
                                           f'exactly_once = true\nmessages_topic = "{name}.m"'))
    run_router(cfg)
    pg.run(f"update {name} set n = n + 1 where id = 0")
    run_router(cfg)  # Kafka's progress is now past zero
    pg.run(f"select pg_logical_emit_message(false, '{name}', 'hello')")
    pg.run(f"update {name} set n = n + 1 where id = 0")
    run_router(cfg)
    # every slot of the database decodes a non-transactional message: only this test's
    messages = [m for m in changes(kafka_bootstrap, f"{name}.m")
                if m["message"]["prefix"] == name]
    assert [m["op"] for m in messages] == ["m"], messages


def test_broker_restart_leaves_each_change_once(fault_stack, tmp_path):
    """On the fault tests' stack of its own (tests/e2e/conftest.py): its broker is
    restarted under load."""
    import devstack

    root, info = fault_stack
    pg = Pg(info.pg_dsn)
    name = unique("eob")
    pg.run(f"create table {name} (id bigint primary key, n int, payload text)")
    pg.run(f"insert into {name} select g, 0, 'hot' from generate_series(0, {HOT - 1}) g")
    pg.run(f"create publication {name} for table {name}")
    cfg = write_config(tmp_path / "r.toml", dsn=info.pg_dsn, slot=name, publications=[name],
                       bootstrap=info.kafka_bootstrap,
                       kafka_extra=f'client = "librdkafka"\nexactly_once = true\n'
                                   f'committed_lsn_topic = "{name}.progress"\n',
                       routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                              f'topic = "{name}"\ntopic_settings = {{ partitions = 3 }}\n')
    rows = 10_000
    try:
        run_router(cfg)
        proc = start_router(cfg, tmp_path / "router.log")
        load = Load(info.pg_dsn, name, rows)
        sampler = ConfirmSampler(info.pg_dsn, name)
        try:
            wait_for_line(tmp_path / "router.log", "streaming started", proc, timeout=120)
            load.start()
            sampler.start()
            # the broker goes away while transactions are being written: placed by the
            # changes Kafka already committed
            deadline = time.monotonic() + 120
            while len(changes(info.kafka_bootstrap, name)) < 500:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            devstack.stop_service(root, "kafka")
            stopped = time.time()
            time.sleep(5)
            down = sampler.between(stopped + 1.5, time.time())  # past in-flight confirms
            devstack.ensure_up(root, registry=False)
            # no Kafka commit while the broker is down, so no confirmation either
            assert len(down) > 20 and len({c for _, c in down}) == 1, down[:3] + down[-3:]
            load.join(timeout=300)
            assert load.error is None, load.error
            time.sleep(2)
            assert proc.poll() is None, (tmp_path / "router.log").read_text()[-3000:]
        finally:
            sampler.stop()
            proc.terminate()
            proc.wait(timeout=120)
        assert proc.returncode == 0, (tmp_path / "router.log").read_text()[-3000:]
        assert max(c for _, c in sampler.samples) > max(c for _, c in down), \
            "the router confirmed nothing after the broker came back"
        run_router(cfg, timeout=300)
        records = changes(info.kafka_bootstrap, name)
        positions = [(r["source"]["commit_lsn"], r["source"]["seq"]) for r in records]
        assert len(positions) == len(set(positions)), "a change reached read_committed twice"
        inserted = sorted(r["after"]["id"] for r in records if r["op"] == "c")
        assert inserted == list(range(HOT, HOT + rows))
        for key in range(HOT):
            counts = [r["after"]["n"] for r in records
                      if r["op"] == "u" and r["after"]["id"] == key]
            assert counts == list(range(1, rows // BATCH + 1)), f"key {key}: {counts[:20]}…"
    finally:
        drop_made(pg, name, if_exists=False)


def second_waits_for_the_frozen_first(pg: Pg, name: str, cfg, bootstrap: str, logs: list,
                                      procs: list) -> None:
    """With the first router (``procs[0]``) frozen by SIGSTOP, a second on the same config
    (appended to ``procs``) waits for the slot rather than streams; the first, thawed, streams
    an update while the second still waits."""
    procs.append(start_router(cfg, logs[1]))
    deadline = time.monotonic() + 20
    while "waiting for the slot" not in logs[1].read_text():
        text = logs[1].read_text()
        assert time.monotonic() < deadline and "streaming started" not in text, text[-3000:]
        time.sleep(0.2)
    os.killpg(procs[0].pid, signal.SIGCONT)
    wait_for_line(logs[0], "streaming started", procs[0], timeout=30)
    first_update_delivered(pg, bootstrap, name, 1, procs[0], logs[0], timeout=30)
    assert procs[1].poll() is None, logs[1].read_text()[-3000:]


def thaw_and_kill(procs: list) -> None:
    """Kills (-9) each router, one still frozen by SIGSTOP thawed first."""
    for proc in procs:
        os.killpg(proc.pid, signal.SIGCONT) if proc.poll() is None else None
        kill9(proc)


def test_a_second_router_waits_while_the_first_copies_its_initial_snapshot(table,
                                                                          kafka_bootstrap,
                                                                          tmp_path):
    """The first router made the slot with an exported snapshot and is still copying the
    tables (the slot is not streamed yet, so it shows as free): a second router on the
    same config waits for it too, instead of registering the transactional id and fencing
    the copy. The first is frozen (SIGSTOP) in its copy, standing for a long one."""
    pg, name, config = table
    cfg = config("librdkafka")
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    procs = [start_router(cfg, logs[0])]
    try:
        wait_for_line(logs[0], "replication slot created with an exported snapshot", procs[0])
        os.killpg(procs[0].pid, signal.SIGSTOP)
        second_waits_for_the_frozen_first(pg, name, cfg, kafka_bootstrap, logs, procs)
    finally:
        thaw_and_kill(procs)
    text = logs[0].read_text() + logs[1].read_text()
    assert "fenced" not in text, text[-3000:]
    copied = sorted(r["after"]["id"] for r in changes(kafka_bootstrap, name) if r["op"] == "r")
    assert copied == list(range(HOT)), len(copied)


def test_the_first_router_killed_while_a_second_waits_the_second_takes_over_once(
        table, kafka_bootstrap, tmp_path):
    """The first router is killed (-9) mid-stream while a second on the same config waits
    for the slot: the second takes over, and a read_committed consumer sees every change
    once, none lost (each key's counter 1..n, n as SELECT reads it)."""
    pg, name, config = table
    cfg = config("librdkafka")
    run_router(cfg)  # the slot and its initial snapshot
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    procs = [start_router(cfg, logs[0])]
    made = 0
    try:
        wait_for_line(logs[0], "streaming started", procs[0])
        procs.append(start_router(cfg, logs[1]))
        wait_for_line(logs[1], "waiting for the slot", procs[1])
        for i in range(40):  # commits before, during and after the kill
            pg.run(f"update {name} set n = n + 1 where id = {i % HOT}")
            made += 1
            if i == 20:
                kill9(procs[0])
            time.sleep(0.05)
        wait_for_line(logs[1], "streaming started", procs[1], timeout=30)
        want = {i: pg.one(f"select n from {name} where id = {i}") for i in range(HOT)}
        assert sum(want.values()) == made
        deadline = time.monotonic() + 60
        while {i: updates_of(kafka_bootstrap, name, i) for i in range(HOT)} != \
                {i: list(range(1, n + 1)) for i, n in want.items()}:
            assert time.monotonic() < deadline and procs[1].poll() is None, \
                ({i: updates_of(kafka_bootstrap, name, i) for i in range(HOT)}, want,
                 logs[1].read_text()[-3000:])
            time.sleep(0.5)
    finally:
        for proc in procs:
            kill9(proc)
    assert "fenced" not in logs[1].read_text(), logs[1].read_text()[-3000:]


def test_a_second_router_waits_for_one_that_registered_but_streams_not_yet(
        table, kafka_bootstrap, tmp_path):
    """The first router registered the transactional id and has not started streaming yet
    (the slot shows as free): a second on the same config waits for it, instead of
    registering the id again and fencing it. The first is frozen (SIGSTOP) right after it
    registered, standing for a slow start."""
    pg, name, config = table
    cfg = config("librdkafka")
    run_router(cfg)  # the slot and its initial snapshot
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    procs = [start_router(cfg, logs[0])]
    try:
        deadline = time.monotonic() + 30
        while "exactly-once: Kafka transactions" not in logs[0].read_text():
            assert time.monotonic() < deadline and procs[0].poll() is None
            time.sleep(0.002)
        os.killpg(procs[0].pid, signal.SIGSTOP)
        assert "streaming started" not in logs[0].read_text()
        second_waits_for_the_frozen_first(pg, name, cfg, kafka_bootstrap, logs, procs)
    finally:
        thaw_and_kill(procs)
    text = logs[0].read_text() + logs[1].read_text()
    assert "fenced" not in text, text[-3000:]


def test_three_routers_started_at_once_one_streams_two_wait(table, kafka_bootstrap,
                                                            tmp_path):
    """Three `pgrouter run` on one new config at once (the slot still to be made, with its
    initial snapshot): one makes the slot and streams, the others wait for it; nobody is
    fenced and the copy reaches Kafka once."""
    pg, name, config = table
    cfg = config("librdkafka")
    logs = [tmp_path / f"r{i}.log" for i in range(3)]
    procs = [start_router(cfg, log) for log in logs]
    try:
        deadline = time.monotonic() + 30
        while True:
            texts = [log.read_text() for log in logs]
            if (sum("streaming started" in t for t in texts) == 1
                    and sum("waiting for the slot" in t for t in texts) == 2):
                break
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                [t[-1500:] for t in texts]
            time.sleep(0.2)
        pg.run(f"update {name} set n = n + 1 where id = 1")
        deadline = time.monotonic() + 30
        while updates_of(kafka_bootstrap, name, 1) != [1]:
            assert time.monotonic() < deadline, [log.read_text()[-1500:] for log in logs]
            time.sleep(0.3)
        assert all(p.poll() is None for p in procs), [log.read_text()[-1500:] for log in logs]
    finally:
        for proc in procs:
            kill9(proc)
    text = "".join(log.read_text() for log in logs)
    assert "fenced" not in text, text[-3000:]
    copied = sorted(r["after"]["id"] for r in changes(kafka_bootstrap, name) if r["op"] == "r")
    assert copied == list(range(HOT)), len(copied)
