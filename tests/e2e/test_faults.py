"""No loss under faults: the router killed with SIGKILL, the Kafka broker restarted and
PostgreSQL restarted, each in the middle of a load.

The oracle is PostgreSQL: a second slot with the ``test_decoding`` plugin, created before the
load, lists every committed transaction with its commit LSN and the ids it inserted. Right
after each kill the slot's ``confirmed_flush_lsn`` is read together with what Kafka holds at
that moment: every transaction committed before the confirmed position must already be in
Kafka. Afterwards every committed row is in Kafka, and copies of a record are identical.

These tests run on a dev stack of their own (``.devstack/faults``) so restarting its broker
and server disturbs no other test.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time

import psycopg2
import pytest

from actors import devstack
from tests.helpers import (ROOT, Pg, kill9, read_topic, run_router, start_router, unique,
                           write_config)

pytestmark = pytest.mark.services

# the SIGKILL test runs ≥ 100k changes; the restart tests need only a load that spans the
# restart (override both with PGROUTER_FAULT_ROWS for quick runs)
ROWS = int(os.environ.get("PGROUTER_FAULT_ROWS", "100000"))
RESTART_ROWS = int(os.environ.get("PGROUTER_FAULT_ROWS", "30000"))
BATCH = 100
CLIENTS = ["kafka-python"]
try:  # the librdkafka client (issue 8) rides the same contract when present
    import actors.kafka.librdkafka  # noqa: F401
    CLIENTS.append("librdkafka")
except ImportError:
    pass


@pytest.fixture(scope="module")
def stack():
    root = ROOT / ".devstack" / "faults"
    try:
        info = devstack.ensure_up(root)
    except Exception as exc:
        pytest.fail(f"fault-test stack could not be started: {exc}", pytrace=False)
    yield root, info
    devstack.down(root)


class Load(threading.Thread):
    """Inserts ``rows`` rows in transactions of ``BATCH``; survives server restarts (a
    batch whose commit outcome is unknown is checked and retried)."""

    def __init__(self, dsn: str, table: str, rows: int):
        super().__init__(daemon=True)
        self.dsn, self.table, self.rows = dsn, table, rows
        self.error: BaseException | None = None
        self.done_batches = 0

    def _connect(self):
        deadline = time.monotonic() + 120
        while True:
            try:
                conn = psycopg2.connect(self.dsn, connect_timeout=5)
                conn.autocommit = False
                return conn
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def run(self):
        try:
            conn = self._connect()
            batch = 0
            while batch * BATCH < self.rows:
                try:
                    with conn.cursor() as cur:
                        cur.execute(f"select count(*) from {self.table} where batch = %s", (batch,))
                        if cur.fetchone()[0] == 0:
                            cur.execute(
                                f"insert into {self.table} (id, batch, payload) select g, %s, "
                                f"repeat(md5(g::text), 8) from generate_series(%s, %s) g",
                                (batch, batch * BATCH, batch * BATCH + BATCH - 1))
                    conn.commit()
                    batch += 1
                    self.done_batches = batch
                except (psycopg2.OperationalError, psycopg2.InterfaceError):
                    try:
                        conn.close()
                    except Exception:
                        pass
                    conn = self._connect()
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def oracle_transactions(pg: Pg, slot: str) -> list[tuple[int, set[int]]]:
    """(commit record LSN, ids inserted) of every committed transaction, from test_decoding."""
    txns, ids = [], set()
    for lsn, data in pg.run("select lsn::text, data from pg_logical_slot_peek_changes(%s, null, null)",
                            slot):
        if data.startswith("BEGIN"):
            ids = set()
        elif data.startswith("table "):
            m = re.search(r"id\[bigint\]:(\d+)", data)
            if m:
                ids.add(int(m.group(1)))
        elif data.startswith("COMMIT"):
            hi, lo = lsn.split("/")
            txns.append(((int(hi, 16) << 32) | int(lo, 16), ids))
    return txns


def kafka_ids(bootstrap: str, topic: str) -> tuple[set[int], list[dict]]:
    records = read_topic(bootstrap, topic, timeout=120)
    return {r["key"]["id"] for r in records}, records


def confirmed_lsn(pg: Pg, slot: str) -> int:
    text = pg.one("select confirmed_flush_lsn::text from pg_replication_slots where slot_name = %s",
                  slot)
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def assert_identical_duplicates(records: list[dict]) -> None:
    seen: dict = {}
    for r in records:
        src = r["value"]["source"]
        pos = (src["commit_lsn"], src["seq"])
        assert seen.setdefault(pos, r["raw"]) == r["raw"], f"two different records at {pos}"


@pytest.fixture
def setup(stack, tmp_path, request):
    root, info = stack
    client = request.param if hasattr(request, "param") else "kafka-python"
    pg = Pg(info.pg_dsn)
    name = unique("fault")
    pg.run(f"create table {name} (id bigint primary key, batch int, payload text)")
    pg.run(f"create publication {name} for table {name}")
    pg.run("select pg_create_logical_replication_slot(%s, 'test_decoding')", f"{name}_oracle")
    cfg = write_config(tmp_path / "router.toml", dsn=info.pg_dsn, slot=name, publications=[name],
                       bootstrap=info.kafka_bootstrap,
                       kafka_extra=f'client = "{client}"',
                       routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                              f'topic = "{name}"\n'
                              f'topic_settings = {{ partitions = 3 }}\n')
    run_router(cfg)  # create the slot before the load starts
    yield root, info, pg, name, cfg, tmp_path
    try:
        pg.close()
    except Exception:
        pass
    pg = Pg(info.pg_dsn)
    pg.drop_slot(name)
    pg.drop_slot(f"{name}_oracle")
    pg.run(f"drop publication {name}")
    pg.run(f"drop table {name}")
    pg.close()


def finish_and_check(info, pg: Pg, name: str, cfg, load: Load, samples=()) -> None:
    rows = load.rows
    load.join(timeout=600)
    assert not load.is_alive(), "load did not finish"
    assert load.error is None, f"load failed: {load.error!r}"
    run_router(cfg, timeout=300)
    ids, records = kafka_ids(info.kafka_bootstrap, name)
    table_ids = {r[0] for r in pg.run(f"select id from {name}")}
    assert len(table_ids) == rows
    assert table_ids - ids == set(), f"{len(table_ids - ids)} committed rows missing in Kafka"
    assert ids - table_ids == set()
    assert_identical_duplicates(records)
    txns = oracle_transactions(pg, f"{name}_oracle")
    assert set().union(*(t[1] for t in txns)) == table_ids
    for confirmed, in_kafka in samples:
        unsafe = [lsn for lsn, t_ids in txns if lsn < confirmed and not t_ids <= in_kafka]
        assert not unsafe, (f"confirmed_flush_lsn {confirmed:X} passed {len(unsafe)} "
                            "transactions that were not yet in Kafka")


@pytest.mark.parametrize("setup", CLIENTS, indirect=True)
def test_router_killed_with_sigkill_loses_nothing(setup):
    root, info, pg, name, cfg, tmp = setup
    load = Load(info.pg_dsn, name, ROWS)
    load.start()
    rng = random.Random(7)
    samples = []
    for i in range(4):
        proc = start_router(cfg, tmp / f"router-{i}.log")
        time.sleep(rng.uniform(1.0, 4.0))
        assert proc.poll() is None, (tmp / f"router-{i}.log").read_text()[-3000:]
        kill9(proc)
        # the walsender notices the dead client; then the slot's position is final
        deadline = time.monotonic() + 30
        while pg.one("select active from pg_replication_slots where slot_name = %s", name):
            assert time.monotonic() < deadline, "slot stayed active after the kill"
            time.sleep(0.1)
        confirmed = confirmed_lsn(pg, name)
        in_kafka, _ = kafka_ids(info.kafka_bootstrap, name)
        samples.append((confirmed, in_kafka))
    assert any(s[0] for s in samples)
    finish_and_check(info, pg, name, cfg, load, samples)


@pytest.mark.parametrize("setup", CLIENTS, indirect=True)
@pytest.mark.parametrize("service", ["kafka", "pg"])
def test_service_restarted_mid_load(setup, service):
    """The broker or the server stops and comes back while changes stream: the router rides
    it out (the server restart through a pipeline restart) and loses nothing."""
    root, info, pg, name, cfg, tmp = setup
    load = Load(info.pg_dsn, name, RESTART_ROWS)
    load.start()
    proc = start_router(cfg, tmp / "router.log")
    try:
        time.sleep(2)
        if service == "pg":
            pg.close()
        devstack.stop_service(root, service)
        time.sleep(3)
        devstack.ensure_up(root)
        load.join(timeout=600)
        time.sleep(2)
        assert proc.poll() is None, f"the router must ride out a {service} restart"
    finally:
        proc.terminate()  # SIGTERM: drain
        proc.wait(timeout=120)
    log = (tmp / "router.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    if service == "pg":
        assert "restarting after transient failure" in log
    pg = Pg(info.pg_dsn)
    try:
        finish_and_check(info, pg, name, cfg, load)
    finally:
        pg.close()


def test_kafka_down_mid_stream_is_said_within_seconds(setup):
    """The broker stops while records wait for acknowledgements: a line says so within
    seconds (the client retries until its delivery timeout), another when it is back, and
    nothing is lost."""
    root, info, pg, name, cfg, tmp = setup
    load = Load(info.pg_dsn, name, RESTART_ROWS)
    log_path = tmp / "router.log"
    proc = start_router(cfg, log_path)
    try:
        pg.run(f"insert into {name} values (-1, 0, 'topic and schema exist')")
        deadline = time.monotonic() + 60
        while "records_acked=1 " not in log_path.read_text():
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        devstack.stop_service(root, "kafka")
        load.start()  # changes arrive while no broker acknowledges them
        stopped = time.monotonic()
        while "kafka has not acknowledged records" not in log_path.read_text():
            assert time.monotonic() - stopped < 15, log_path.read_text()[-3000:]
            time.sleep(0.2)
        devstack.ensure_up(root)
        load.join(timeout=600)
        time.sleep(2)
        assert proc.poll() is None, "the router must ride out a broker outage"
    finally:
        proc.terminate()  # SIGTERM: drain
        proc.wait(timeout=120)
    log = log_path.read_text()
    assert proc.returncode == 0, log[-3000:]
    assert "Traceback" not in log
    assert "kafka acknowledges records again" in log
    assert load.error is None, f"load failed: {load.error!r}"
    run_router(cfg, timeout=300)
    ids, records = kafka_ids(info.kafka_bootstrap, name)
    pg = Pg(info.pg_dsn)
    try:
        table_ids = {r[0] for r in pg.run(f"select id from {name}")}
    finally:
        pg.close()
    assert table_ids - ids == set(), f"{len(table_ids - ids)} committed rows missing in Kafka"
    assert_identical_duplicates(records)
