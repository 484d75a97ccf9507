"""Failures the README names, met by `pgrouter run` itself: malformed bytes from the server,
a missing slot, SIGINT (drain) and a second signal (abort). Each stops with one clear line
(or drains), exits as documented, and never confirms what Kafka does not hold."""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests.e2e.guarantee import (TOPIC_CONFIGS, ConfirmSampler, Load, check_confirmation,
                                 oracle_transactions, topic_size, wait_for)
from tests.e2e.wire_proxy import CorruptingProxy
from tests.helpers import (ROOT, Pg, drop_source, read_topic, router_cmd, start_router, unique,
                           write_config)

pytestmark = pytest.mark.services


@pytest.fixture
def source(pg_dsn, kafka_bootstrap, tmp_path):
    """A table, its publication, a pgoutput slot, a test_decoding oracle slot and a config
    routing the table to a topic of the same name; all dropped afterwards."""
    pg = Pg(pg_dsn)
    name = unique("fail")
    pg.run(f"create table {name} (id bigint primary key, batch int, payload text)")
    pg.run(f"create publication {name} for table {name}")
    pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", name)
    pg.run("select pg_create_logical_replication_slot(%s, 'test_decoding')", f"{name}_oracle")
    conf = ", ".join(f'"{k}" = "{v}"' for k, v in TOPIC_CONFIGS.items())

    def config(dsn: str = pg_dsn, **kw):
        return write_config(tmp_path / "router.toml", dsn=dsn, slot=name, publications=[name],
                            bootstrap=kafka_bootstrap,
                            routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                                   f'topic = "{name}"\n'
                                   f"topic_settings = {{ configs = {{ {conf} }} }}\n", **kw)

    yield pg, name, config
    pg.drop_slot(f"{name}_oracle")
    drop_source(pg, name, kafka_bootstrap, (name,))


def confirmed(pg: Pg, slot: str) -> str:
    return pg.one("select confirmed_flush_lsn::text from pg_replication_slots "
                  "where slot_name = %s", slot)


def test_malformed_server_bytes_stop_with_one_line(source, kafka_bootstrap):
    pg, name, config = source
    port = int(pg.dsn.rsplit(":", 1)[1].split("/")[0])
    proxy = CorruptingProxy(port)
    try:
        proxy.armed.set()
        cfg = config(dsn=pg.dsn.replace(f":{port}/", f":{proxy.port}/"))
        pg.run(f"insert into {name} select g, 0, 'x' from generate_series(1, 10) g")
        proc = subprocess.run(router_cmd(cfg, "--until-caught-up"), capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
    finally:
        proxy.close()
    assert proxy.corrupted.is_set(), "the proxy saw no Insert to corrupt"
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("pgrouter run:") and "Insert expects 'N', got 0x5a" in last, last
    assert pg.pending_changes(name, name) == "I" * 10, \
        "confirmed past a transaction it could not decode"
    assert read_topic(kafka_bootstrap, name, timeout=30, missing_ok=True, settle=0) == []


def test_missing_slot_on_run_is_one_line(source, tmp_path):
    pg, name, config = source
    pg.drop_slot(name)
    cfg = config()
    cfg.write_text(cfg.read_text().replace("create_slot = true", "create_slot = false"))
    proc = subprocess.run(router_cmd(cfg, "--until-caught-up"), capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("pgrouter run:") and name in last and "slot" in last, last
    assert not pg.run("select 1 from pg_replication_slots where slot_name = %s", name)


def test_sigint_drains_and_confirms_what_it_delivered(source, kafka_bootstrap, tmp_path):
    pg, name, config = source
    proc = start_router(config(), tmp_path / "r.log")
    wait_for(lambda: pg.one("select active from pg_replication_slots where slot_name = %s",
                            name), timeout=60, what="the router to stream")
    pg.run(f"insert into {name} select g, 0, 'x' from generate_series(1, 50) g")
    end = pg.one("select pg_current_wal_lsn()::text")
    wait_for(lambda: topic_size(kafka_bootstrap, name) >= 50, timeout=60,
             what="the rows in Kafka")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    log = (tmp_path / "r.log").read_text()
    assert "draining" in log and "final confirmed position sent" in log, log[-2000:]
    assert "Traceback" not in log
    assert pg.one("select confirmed_flush_lsn >= %s::pg_lsn from pg_replication_slots "
                  "where slot_name = %s", end, name), "the drain did not confirm what it sent"


def test_second_signal_aborts_without_confirming_past_kafka(source, kafka_bootstrap, tmp_path):
    pg, name, config = source
    sampler = ConfirmSampler(pg.dsn, name)
    sampler.start()
    load = Load(pg.dsn, name, 50000)
    load.start()
    start = confirmed(pg, name)
    proc = start_router(config(), tmp_path / "r.log")
    try:
        # the abort must meet confirmations to check: records in Kafka and the slot moved
        wait_for(lambda: topic_size(kafka_bootstrap, name) > 2000
                 and confirmed(pg, name) != start, timeout=120,
                 what="records in Kafka and a confirmed position")
        proc.send_signal(signal.SIGINT)
        # the second signal once the first was seen (two pending ones would merge)
        wait_for(lambda: "draining" in (tmp_path / "r.log").read_text(), timeout=30,
                 what="the drain to start", interval=0.01)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        load.join(timeout=120)
    log = (tmp_path / "r.log").read_text()
    assert "aborting" in log, log[-2000:]
    assert "Traceback" not in log
    wait_for(lambda: not pg.one("select active from pg_replication_slots where slot_name = %s",
                                name), timeout=30, what="the slot to be released")
    samples = sampler.stop()
    records = read_topic(kafka_bootstrap, name, timeout=120)
    txns = oracle_transactions(pg, f"{name}_oracle", name)  # other tests share the database
    assert check_confirmation(samples, txns, records) > 0
