"""No loss under faults: the router killed with SIGKILL, the Kafka broker restarted and
PostgreSQL restarted, each in the middle of a load.

While each fault runs, ``guarantee.ConfirmSampler`` reads the slot's ``confirmed_flush_lsn``
every ~20 ms; the topic records the broker's append time of each record, so afterwards every
reading is compared with what Kafka held at that very moment (``guarantee`` explains the
rule). Each fault is shown to have landed mid-stream: records in Kafka before it, the load
still running, records added after it. The kills must produce duplicates, and every copy is
byte-identical at the same position.

``test_the_checks_catch_a_router_that_confirms_before_kafka`` proves these checks can fail:
the same kills against a router whose delivery rule is broken from the test side
(tests/e2e/broken_router.py confirms before Kafka acknowledged) must be reported as loss.

These tests run on a dev stack of their own (``.devstack/faults``, ``fault_stack`` in
tests/e2e/conftest.py) so restarting its broker and server disturbs no other test.
"""

from __future__ import annotations

import os
import random
import time

import pytest

import devstack
from tests.e2e.guarantee import (TOPIC_CONFIGS, ConfirmSampler, Load, delete_topics, lsn_int,
                                 max_stall, topic_size, verify, wait_for)
from tests.helpers import (Pg, kill9, read_topic, run_router, start_router, unique,
                           write_config)

pytestmark = pytest.mark.services

# the SIGKILL test runs a load of ROWS changes; the restart tests need only a load that
# spans the restart (override both with PGROUTER_FAULT_ROWS for quick runs)
ROWS = int(os.environ.get("PGROUTER_FAULT_ROWS", "100000"))
RESTART_ROWS = int(os.environ.get("PGROUTER_FAULT_ROWS", "30000"))
CLIENTS = ["kafka-python"]
try:  # the librdkafka client (issue 8) rides the same contract when present
    import actors.kafka.librdkafka  # noqa: F401
    CLIENTS.append("librdkafka")
except ImportError:
    pass


def kafka_ids(bootstrap: str, topic: str) -> tuple[set[int], list[dict]]:
    records = read_topic(bootstrap, topic, timeout=120)
    return {r["key"]["id"] for r in records}, records


def confirmed_lsn(pg: Pg, slot: str) -> int:
    return lsn_int(pg.one("select confirmed_flush_lsn::text from pg_replication_slots "
                          "where slot_name = %s", slot))


def assert_identical_duplicates(records: list[dict]) -> None:
    seen: dict = {}
    for r in records:
        src = r["value"]["source"]
        pos = (src["commit_lsn"], src["seq"])
        assert seen.setdefault(pos, r["raw"]) == r["raw"], f"two different records at {pos}"


@pytest.fixture
def stack(fault_stack):
    return fault_stack  # tests/e2e/conftest.py


def topic_settings(partitions: int = 3, replication_factor: int = 1,
                   **configs: str) -> str:
    conf = ", ".join(f'"{k}" = "{v}"' for k, v in {**TOPIC_CONFIGS, **configs}.items())
    return (f"topic_settings = {{ partitions = {partitions}, "
            f"replication_factor = {replication_factor}, configs = {{ {conf} }} }}\n")


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
                              f'topic = "{name}"\n' + topic_settings())
    run_router(cfg)  # create the slot and the topic before the load starts
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
    delete_topics(info.kafka_bootstrap, [name])


def finish(load: Load) -> None:
    load.join(timeout=600)
    assert not load.is_alive(), "load did not finish"
    assert load.error is None, f"load failed: {load.error!r}"


def caught_up(pg: Pg, slot: str) -> bool:
    """The slot confirmed everything written so far."""
    return pg.one("select confirmed_flush_lsn >= pg_current_wal_lsn() from pg_replication_slots "
                  "where slot_name = %s", slot)


@pytest.mark.parametrize("setup", CLIENTS, indirect=True)
def test_router_killed_with_sigkill_loses_nothing(setup):
    root, info, pg, name, cfg, tmp = setup
    bootstrap = info.kafka_bootstrap
    sampler = ConfirmSampler(info.pg_dsn, name)
    sampler.start()
    load = Load(info.pg_dsn, name, 100 * ROWS)  # runs until the kills are done
    load.start()
    rng = random.Random(7)
    kills = []
    for i in range(4):
        log = tmp / f"router-{i}.log"
        before = topic_size(bootstrap, name)
        proc = start_router(cfg, log)
        try:
            # mid-stream: this run has put records into Kafka, and the load still runs
            wait_for(lambda: proc.poll() is not None
                     or topic_size(bootstrap, name) > before + 300,
                     timeout=120, what=f"run {i} to write records")
            time.sleep(rng.uniform(0.0, 1.0))  # a random point in the stream, not a sync
            assert proc.poll() is None, log.read_text()[-3000:]
            assert load.running, "the load stopped before the kill"
        finally:
            kill9(proc)
        kills.append((before, topic_size(bootstrap, name)))
        # the walsender notices the dead client; then the slot's position is final
        wait_for(lambda: not pg.one("select active from pg_replication_slots "
                                    "where slot_name = %s", name),
                 timeout=30, what="the slot to be released after the kill")
    wait_for(lambda: load.done_batches * load.batch >= ROWS, timeout=600,
             what=f"{ROWS} rows inserted")
    rows = load.stop()
    run_router(cfg, timeout=300)
    samples = sampler.stop()
    assert topic_size(bootstrap, name) > kills[-1][1], "nothing was written after the last kill"
    figures = verify(pg, bootstrap, name, f"{name}_oracle", samples, rows=rows)
    assert figures["checked"] > 50, figures
    # a kill between Kafka's acknowledgement and the next confirmation resends: duplicates
    assert figures["duplicates"] > 0, "no kill caused a resend: the kills exercised nothing"


def test_the_checks_catch_a_router_that_confirms_before_kafka(setup):
    """The proof that the checks above can fail: the same kills, placed by observed progress,
    against a router that confirms a transaction as soon as the sink accepted it (the fault is
    injected from the test side, tests/e2e/broken_router.py). The guarantee checker must
    report it: readings confirmed past Kafka, or committed rows missing from the topic."""
    root, info, pg, name, cfg, tmp = setup
    bootstrap = info.kafka_bootstrap
    sampler = ConfirmSampler(info.pg_dsn, name)
    sampler.start()
    load = Load(info.pg_dsn, name, 100 * ROWS)
    load.start()
    for i in range(3):
        log = tmp / f"broken-{i}.log"
        before = topic_size(bootstrap, name)
        proc = start_router(cfg, log, module="tests.e2e.broken_router")
        try:
            wait_for(lambda: proc.poll() is not None
                     or topic_size(bootstrap, name) > before + 300,
                     timeout=120, what=f"broken run {i} to write records")
            assert proc.poll() is None, log.read_text()[-3000:]
            assert load.running, "the load stopped before the kill"
        finally:
            kill9(proc)
        wait_for(lambda: not pg.one("select active from pg_replication_slots "
                                    "where slot_name = %s", name),
                 timeout=30, what="the slot to be released after the kill")
    rows = load.stop()
    run_router(cfg, timeout=300)  # the real router finishes what the slot still has
    samples = sampler.stop()
    with pytest.raises(AssertionError, match="confirmed past Kafka|committed rows missing"):
        verify(pg, bootstrap, name, f"{name}_oracle", samples, rows=rows)


@pytest.mark.parametrize("setup", CLIENTS, indirect=True)
@pytest.mark.parametrize("service", ["kafka", "pg"])
def test_service_restarted_mid_load(setup, service):
    """The broker or the server stops and comes back while changes stream: the router rides
    it out (the server restart through a pipeline restart) and loses nothing."""
    root, info, pg, name, cfg, tmp = setup
    bootstrap = info.kafka_bootstrap
    sampler = ConfirmSampler(info.pg_dsn, name)
    sampler.start()
    log = tmp / "router.log"
    proc = start_router(cfg, log)
    # a steady load (40 transactions a second) that spans the fault
    load = Load(info.pg_dsn, name, RESTART_ROWS, rate=40, batch=50)
    load.start()
    try:
        wait_for(lambda: topic_size(bootstrap, name) > 500, timeout=120,
                 what="records in Kafka before the fault")
        assert load.running, "the load finished before the fault: raise PGROUTER_FAULT_ROWS"
        if service == "pg":
            pg.close()
        stopped = time.time()
        devstack.stop_service(root, service)
        if service == "kafka":  # changes keep committing that the router cannot deliver
            committed = load.done_batches
            wait_for(lambda: load.done_batches >= committed + 20 and len(
                sampler.between(stopped, time.time())) >= 20, timeout=60,
                     what="the load and the sampler to go on during the broker outage")
        else:  # the router notices the server is gone
            wait_for(lambda: "restarting after transient failure" in log.read_text(),
                     timeout=60, what="the router to notice the server outage")
        devstack.ensure_up(root, registry=False)
        back = time.time()
        after_restart = topic_size(bootstrap, name)
        wait_for(lambda: topic_size(bootstrap, name) > after_restart, timeout=120,
                 what=f"records after the {service} restart")
        finish(load)
        pg = Pg(info.pg_dsn)
        wait_for(lambda: caught_up(pg, name), timeout=180, what="the router to catch up")
        assert proc.poll() is None, f"the router must ride out a {service} restart"
    finally:
        proc.terminate()  # SIGTERM: drain
        proc.wait(timeout=120)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    samples = sampler.stop()
    try:
        figures = verify(pg, bootstrap, name, f"{name}_oracle", samples, rows=RESTART_ROWS)
    finally:
        pg.close()
    if service == "kafka":
        assert sampler.between(stopped, back), "no reading during the outage"
    print(f"{service} restart: stall {max_stall(figures['all'], stopped - 1, back + 30):.1f}s, "
          f"{figures['samples']} readings, {figures['duplicates']} duplicates")


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
        devstack.ensure_up(root, registry=False)
        load.join(timeout=600)
        back = time.monotonic()
        while "kafka acknowledges records again" not in log_path.read_text():
            assert time.monotonic() - back < 120, log_path.read_text()[-3000:]
            assert proc.poll() is None, "the router must ride out a broker outage"
            time.sleep(0.2)
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
