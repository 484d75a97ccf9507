"""Operating the router: ``/metrics`` while data flows, ``/healthz`` and ``/readyz``, the slot's
lag as the server reports it, and a slot the server invalidated (one line, no retry loop).

Metrics are parsed with Prometheus' own text parser and compared with what the topics hold."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devstack.configs import toml
from tests.e2e.console_browser import wait_for
from tests.e2e.sources import new_table, source_config
from tests.helpers import (ROOT, Pg, kill9, read_topic, router_cmd, start_router, unique,
                           write_config)

pytestmark = pytest.mark.services


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(metrics: dict, name: str, **labels) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def status_of(port: int, path: str) -> int | None:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:  # not listening yet
        return None


@pytest.fixture
def metrics_setup(pg_dsn, kafka_bootstrap, tmp_path):
    pg = Pg(pg_dsn)
    name = unique("met")
    pg.run(f"create table {name}_t (id int primary key, v int)")
    pg.run(f"create publication {name}_all for table {name}_t")
    pg.run(f"create publication {name}_big for table {name}_t where (v > 10) "
           "with (publish = 'insert')")
    port = free_port()
    cfg = write_config(
        tmp_path / "router.toml", dsn=pg_dsn, slot=name, publications=[f"{name}_all"],
        bootstrap=kafka_bootstrap, source_extra="two_phase = true",
        routes=toml({"routes": [{"name": f"{name}_all", "tables": [f"public.{name}_t"]},
                                {"name": f"{name}_big", "publication": f"{name}_big"}]}),
        extra=toml({"metrics": {"listen": f"127.0.0.1:{port}", "sample_interval": 0.3,
                                "lag_warning_bytes": 100000}}))
    yield pg, name, cfg, port
    for (gid,) in pg.run("select gid from pg_prepared_xacts where gid like %s", f"{name}%"):
        pg.run(f"rollback prepared '{gid}'")
    pg.drop_slot(name)
    pg.run(f"drop publication {name}_all, {name}_big")
    pg.run(f"drop table {name}_t")
    pg.close()


def test_metrics_follow_the_data_and_the_slot(metrics_setup, kafka_bootstrap, tmp_path):
    pg, name, cfg, port = metrics_setup
    log = tmp_path / "router.log"
    proc = start_router(cfg, log)
    try:
        wait_for(lambda: status_of(port, "/healthz") == 200, "the metrics endpoint", 60)
        wait_for(lambda: status_of(port, "/readyz") == 200, "readiness", 60)
        pg.run(f"insert into {name}_t select i, i from generate_series(1, 40) i")
        pg.run(f"update {name}_t set v = v + 1 where id <= 20")
        pg.run(f"delete from {name}_t where id > 35")
        topic_all, topic_big = f"{name}_all.public.{name}_t", f"{name}_big.public.{name}_t"

        def delivered():
            m = scrape(port)
            n_all = value(m, "pgrouter_records_produced_total", route=f"{name}_all",
                          topic=topic_all)
            return m if n_all >= 65 and value(m, "pgrouter_records_in_flight") == 0 else None
        m = wait_for(delivered, "every record produced and acknowledged")
        for route, topic in ((f"{name}_all", topic_all), (f"{name}_big", topic_big)):
            records = read_topic(kafka_bootstrap, topic)
            assert value(m, "pgrouter_records_produced_total", route=route,
                         topic=topic) == len(records), route
            assert value(m, "pgrouter_produced_bytes_total", route=route, topic=topic) == sum(
                len(r["raw"][0] or b"") + len(r["raw"][1]) for r in records), route
        assert value(m, "pgrouter_transactions_total") >= 3
        assert value(m, "pgrouter_changes_total") >= 40 + 20 + 5
        assert value(m, "pgrouter_streaming") == 1
        # the filtered route: 10 inserts fail its filter, 20 updates and 5 deletes are not
        # among its actions; the plain route drops nothing
        assert value(m, "pgrouter_route_dropped_changes_total", route=f"{name}_big") == 35
        assert value(m, "pgrouter_route_dropped_changes_total", route=f"{name}_all") == 0
        # the initial snapshot of the (then empty) table, with the router's start
        assert value(m, "pgrouter_snapshot_tables_done_total", kind="initial") >= 1
        assert value(m, "pgrouter_stage_duration_seconds_count", stage="decode") > 0
        assert value(m, "pgrouter_stage_duration_seconds_count", stage="route") > 0
        assert value(m, "pgrouter_stage_duration_seconds_count", stage="produce") > 0

        # caught up: the server's own lag figure falls to (nearly) nothing
        wait_for(lambda: value(scrape(port), "pgrouter_slot_lag_bytes") < 100_000,
                 "a small slot lag")
        assert value(scrape(port), "pgrouter_slot_wal_status", status="reserved") == 1

        # a prepared transaction holds confirmation: the lag grows with the WAL written
        # meanwhile, crosses the warning threshold, and shrinks once it is committed
        pg.run(f"begin; insert into {name}_t values (1000, 1000); "
               f"prepare transaction '{name}_held'")
        pg.run(f"insert into {name}_t select i, i from generate_series(2000, 3999) i")
        m = wait_for(lambda: (lambda m: m if value(m, "pgrouter_slot_lag_bytes") > 100_000
                              and value(m, "pgrouter_slot_lag_warning") == 1 else None)(
                                  scrape(port)), "the lag to grow while held")
        # delivery trails by the age of a routed, unconfirmed transaction: here the routed
        # inserts may be confirmed already (the prepared transaction holds the server's
        # slot, not delivery), so 0 is right too; never negative, never an epoch mix-up
        # (its growth is tests/actors/services/test_metrics_pure.py's)
        assert 0 <= value(m, "pgrouter_lag_seconds") < 120
        assert "slot lag above the warning threshold" in log.read_text()
        pg.run(f"commit prepared '{name}_held'")
        wait_for(lambda: value(scrape(port), "pgrouter_slot_lag_bytes") < 100_000,
                 "the lag to shrink after commit prepared")
        wait_for(lambda: value(scrape(port), "pgrouter_lag_seconds") == 0,
                 "nothing left unconfirmed")
        assert value(scrape(port), "pgrouter_slot_lag_warning") == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill9(proc)
    assert proc.returncode == 0, log.read_text()[-3000:]


def test_invalidated_slot_stops_with_one_line(node_db, kafka_bootstrap, tmp_path):
    """A slot the server invalidated (max_slot_wal_keep_size) stops `run` at once, no retries."""
    dsn = node_db("pg3", "inval")
    pg = Pg(dsn)
    name = unique("inv")
    try:
        pg.run(f"create table {name} (id int primary key)")
        pg.run(f"create publication {name} for table {name}")
        pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", name)
        pg.run("alter system set max_slot_wal_keep_size = '1MB'")
        pg.run("select pg_reload_conf()")
        for _ in range(6):  # past 1 MB of WAL and through checkpoints: the slot is lost
            pg.run(f"insert into {name} select g from generate_series(1, 20000) g "
                   "on conflict do nothing")
            pg.run(f"delete from {name}")
            pg.run("select pg_switch_wal()")
            pg.run("checkpoint")
        assert pg.one("select wal_status from pg_replication_slots where slot_name = %s",
                      name) == "lost"
        cfg = write_config(tmp_path / "r.toml", dsn=dsn, slot=name, publications=[name],
                           bootstrap=kafka_bootstrap,
                           routes=f'[[routes]]\nname = "r"\ntables = ["public.{name}"]')
        proc = subprocess.run(router_cmd(cfg, "--until-caught-up"), capture_output=True,
                              text=True, timeout=60, cwd=ROOT)
        assert proc.returncode == 1, proc.stderr[-3000:]
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("pgrouter run:")]
        assert len(lines) == 1 and "was invalidated" in lines[0], proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr and "restarting" not in proc.stderr
    finally:
        pg.run("alter system reset max_slot_wal_keep_size")
        pg.run("select pg_reload_conf()")
        pg.close()


def test_metrics_config_errors_name_the_key(tmp_path, pg_dsn, kafka_bootstrap):
    cfg = write_config(tmp_path / "r.toml", dsn=pg_dsn, slot="x", publications=["p"],
                       bootstrap=kafka_bootstrap, routes='[[routes]]\nname = "r"\nall_tables = true',
                       extra='[metrics]\nlisten = "nowhere"\n')
    proc = subprocess.run(router_cmd(cfg), capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "metrics.listen" in proc.stderr and "Traceback" not in proc.stderr
    assert json.dumps("nowhere") in proc.stderr or "'nowhere'" in proc.stderr


def status(cfg, *args) -> subprocess.CompletedProcess:
    return subprocess.run([*router_cmd(cfg)[:3], "status", "-c", str(cfg), *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_status_shows_the_slot_falling_behind_and_catching_up(metrics_setup, kafka_bootstrap):
    from tests.helpers import run_router

    pg, name, cfg, _ = metrics_setup
    run_router(cfg)  # creates the slot
    pg.run(f"insert into {name}_t select i, i from generate_series(1, 30) i")
    run_router(cfg)
    before = json.loads(status(cfg, "--json").stdout)
    assert before["slot"]["exists"] and not before["slot"]["active"]
    # the router is stopped: WAL written now is retained and the lag grows
    pg.run(f"insert into {name}_t select i, i from generate_series(31, 3000) i")
    behind = status(cfg, "--json")
    assert behind.returncode == 0, behind.stdout + behind.stderr
    report = json.loads(behind.stdout)
    assert report["slot"]["lag_bytes"] > before["slot"]["lag_bytes"] + 100_000
    assert report["slot"]["retained_wal_bytes"] >= report["slot"]["lag_bytes"]
    assert report["slot"]["wal_status"] == "reserved"
    topics = {t["topic"]: t for t in report["routes"][f"{name}_all"]}
    assert f"{name}_all.public.{name}_t" in topics, report
    assert topics[f"{name}_all.public.{name}_t"]["records"] == 30, report
    assert report["last_delivered_commit_time"]
    run_router(cfg)
    after = json.loads(status(cfg, "--json").stdout)
    assert after["slot"]["lag_bytes"] < report["slot"]["lag_bytes"]
    all_topic = {t["topic"]: t for t in after["routes"][f"{name}_all"]}
    assert all_topic[f"{name}_all.public.{name}_t"]["records"] == len(
        read_topic(kafka_bootstrap, f"{name}_all.public.{name}_t")) == 3000
    big = {t["topic"]: t for t in after["routes"][f"{name}_big"]}
    assert big[f"{name}_big.public.{name}_t"]["records"] == 3000 - 10
    text = status(cfg).stdout
    assert f"slot {name}: inactive" in text and "wal_status reserved" in text


def test_status_of_a_missing_slot_fails_with_a_line(metrics_setup):
    pg, name, cfg, _ = metrics_setup
    proc = status(cfg)
    assert proc.returncode == 1
    assert f"replication slot {name!r} does not exist" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("fmt", ["json", "connect"])
def test_status_of_exactly_once_topics(pg_dsn, kafka_bootstrap, tmp_path, fmt):
    """Kafka transactions end with a marker per partition: `status` finds the newest commit
    time behind them (pgrouter's format and Connect's), and counts offsets as at most records."""
    from tests.helpers import run_router

    pg, name = new_table(pg_dsn, "st", "id int primary key, v text")
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=f'exactly_once = true\ncommitted_lsn_topic = "{name}.p"\n'
                                    f'format = "{fmt}"\n',
                        routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                               f'topic = "{name}"\ntopic_settings = {{ partitions = 2 }}\n')
    try:
        run_router(cfg)
        for i in range(3):
            pg.run(f"insert into {name} values ({i}, 'x')")
        run_router(cfg)
        proc = status(cfg, "--json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (topic,) = json.loads(proc.stdout)["routes"][name]
        assert topic["last_commit_time"], topic
        # the offsets, commit markers included: an upper bound (docs/operations.md)
        assert topic["records"] == topic["offsets"] > 3 and not topic["records_exact"], topic
        assert "records at most (offsets: Kafka transaction markers" in status(cfg).stdout
    finally:
        pg.drop_slot(name)
        pg.run(f"drop publication {name}; drop table {name}")
        pg.close()


def test_status_with_kafka_down_answers_within_seconds(metrics_setup, tmp_path):
    pg, name, cfg, _ = metrics_setup
    down = tmp_path / "down.toml"
    down.write_text(cfg.read_text().replace(
        [ln for ln in cfg.read_text().splitlines() if ln.startswith("bootstrap_servers")][0],
        'bootstrap_servers = "127.0.0.1:1"'))
    started = time.monotonic()
    proc = status(down)
    took = time.monotonic() - started
    assert proc.returncode == 1 and "Kafka not reachable" in proc.stdout, proc.stdout
    assert took < 15, took  # the process with its imports; the client waited 30 s before
    assert "Traceback" not in proc.stderr
