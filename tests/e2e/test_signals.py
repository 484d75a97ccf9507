"""Signals on the real stack: a row inserted into ``pgrouter.signals`` asks for a backfill,
read from the stream — while the router streams, and when the row was inserted while the
router was down (acted upon once it is back, exactly once). A bad signal is one warning line
and a ``refused`` record; the router goes on."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from router.snapshot.signals import SETUP_SQL
from tests.e2e.sources import source_config
from tests.helpers import (ROOT, Pg, read_topic, router_cmd, run_router, start_router, unique,
                           wait_line)

pytestmark = pytest.mark.services

ROWS = 60


def setup(pg_dsn, kafka_bootstrap, tmp_path, name):
    pg = Pg(pg_dsn)
    for stmt in SETUP_SQL:  # what `pgrouter setup` runs for the signal table
        pg.run(stmt)
    pg.run(f"create table {name} (id int primary key, v text)")
    pg.run(f"insert into {name} select g, 'v' || g from generate_series(1, {ROWS}) g")
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        extra='[snapshot]\nmode = "never"\n')
    return pg, cfg


def signal_source(pg_dsn, kafka_bootstrap, tmp_path, prefix):
    """``setup`` under a unique name ``<prefix>_…``: (pg, name, config)."""
    name = unique(prefix)
    pg, cfg = setup(pg_dsn, kafka_bootstrap, tmp_path, name)
    return pg, name, cfg


def teardown(pg, name):
    pg.drop_slot(name)
    pg.run("delete from pgrouter.signals where slot = %s", name)
    pg.run(f"drop publication {name}")
    pg.run(f"drop table {name}")
    pg.close()


def snapshot_ids(bootstrap, topic):
    return sorted(r["value"]["after"]["id"] for r in read_topic(bootstrap, topic, missing_ok=True)
                  if r["value"] and r["value"]["op"] == "r")


def signal_states(bootstrap, slot):
    out = {}
    for r in read_topic(bootstrap, "pgrouter.snapshots"):
        v = r["value"]
        if v and v.get("kind") == "signal" and v.get("slot") == slot:
            out[v["request"]] = (v["state"], v.get("problem", ""))
    return out


def test_a_signal_inserted_while_the_router_streams(pg_dsn, kafka_bootstrap, tmp_path):
    pg, name, cfg = signal_source(pg_dsn, kafka_bootstrap, tmp_path, "sig")
    log = tmp_path / "router.log"
    router = None
    try:
        run_router(cfg)  # the slot, no snapshot
        assert snapshot_ids(kafka_bootstrap, name) == []
        router = start_router(cfg, log)
        pg.run(f"update {name} set v = 'changed' where id = 1")  # streamed as usual
        pg.run("insert into pgrouter.signals (route, \"table\", slot) values "
               "(%s, %s, %s)", "nope", f"public.{name}", name)
        pg.run("insert into pgrouter.signals (route, \"table\", slot) values "
               "(%s, %s, %s)", name, f"public.{name}", name)
        deadline = time.monotonic() + 90
        while snapshot_ids(kafka_bootstrap, name) != list(range(1, ROWS + 1)):
            assert time.monotonic() < deadline, f"no backfill:\n{log.read_text()[-3000:]}"
            assert router.poll() is None, f"the router stopped:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        text = log.read_text()
        refused = [line for line in text.splitlines() if "signal refused" in line]
        assert len(refused) == 1 and "route 'nope' is not in the config" in refused[0], text
        assert "Traceback" not in text
        states = sorted(signal_states(kafka_bootstrap, name).values())
        assert states == [("accepted", ""), ("refused", "route 'nope' is not in the config")]
    finally:
        if router is not None:
            router.terminate()
            router.wait(timeout=30)
        teardown(pg, name)


def test_a_signal_inserted_while_the_router_was_down(pg_dsn, kafka_bootstrap, tmp_path):
    pg, name, cfg = signal_source(pg_dsn, kafka_bootstrap, tmp_path, "sigd")
    try:
        run_router(cfg)  # the slot, no snapshot
        pg.run("insert into pgrouter.signals (route, \"table\", slot) values "
               "(%s, %s, %s)", name, f"public.{name}", name)
        pg.run("insert into pgrouter.signals (route, \"table\", slot) values "
               "(%s, %s, %s)", name, "public.no_such_table", name)
        pg.run("insert into pgrouter.signals (route, slot) values (%s, %s)", name, "other")
        done = run_router(cfg)  # waits for the backfill (--until-caught-up)
        assert snapshot_ids(kafka_bootstrap, name) == list(range(1, ROWS + 1))
        refused = [line for line in done.stderr.splitlines() if "signal refused" in line]
        assert len(refused) == 1 and "no_such_table" in refused[0], done.stderr
        run_router(cfg)  # once: the signal is not acted upon again
        assert snapshot_ids(kafka_bootstrap, name) == list(range(1, ROWS + 1))
        assert sorted(s for s, _ in signal_states(kafka_bootstrap, name).values()) == [
            "accepted", "refused"]
        states = json.dumps(signal_states(kafka_bootstrap, name))
        assert "other" not in states
    finally:
        teardown(pg, name)


def test_a_signal_with_a_where_backfills_only_the_rows_it_matches(pg_dsn, kafka_bootstrap,
                                                                  tmp_path):
    pg, name, cfg = signal_source(pg_dsn, kafka_bootstrap, tmp_path, "sigw")
    try:
        run_router(cfg)  # the slot, no snapshot
        insert = ("insert into pgrouter.signals (route, \"table\", slot, \"where\") values "
                  "(%s, %s, %s, %s)")
        pg.run(insert, name, f"public.{name}", name, "id % 10 = 0 and v <> 'v20'")
        # refused, never run: a subquery, a volatile function, a second statement
        pg.run(insert, name, f"public.{name}", name, "id in (select 1)")
        pg.run(insert, name, f"public.{name}", name, "random() < 2")
        pg.run(insert, name, f"public.{name}", name, "true; drop table " + name)
        done = run_router(cfg)  # waits for the backfill (--until-caught-up)
        assert snapshot_ids(kafka_bootstrap, name) == [10, 30, 40, 50, 60], done.stderr
        refused = [line for line in done.stderr.splitlines() if "signal refused" in line]
        assert len(refused) == 3, done.stderr
        assert "subqueries" in refused[0] and "random()" in refused[1], refused
        assert "syntax error" in refused[2], refused
        assert "Traceback" not in done.stderr
        assert pg.one(f"select count(*) from {name}") == ROWS  # never run as a statement
        states = sorted(s for s, _ in signal_states(kafka_bootstrap, name).values())
        assert states == ["accepted", "refused", "refused", "refused"]
        # `pgrouter status`, another process, reads them from the state topic
        out = subprocess.run([*router_cmd(cfg)[:3], "status", "-c", str(cfg), "--json"],
                             capture_output=True, text=True, timeout=60)
        sig = json.loads(out.stdout)["signals"]
        assert (sig["recorded"], sig["states"]) == (4, {"accepted": 1, "refused": 3}), sig
        assert [(s["state"], s["where"]) for s in sig["last"]] == [
            ("accepted", "id % 10 = 0 and v <> 'v20'"), ("refused", "id in (select 1)"),
            ("refused", "random() < 2"), ("refused", "true; drop table " + name)], sig
        assert "subqueries" in sig["last"][1]["problem"] and sig["last"][0]["problem"] is None
        text = subprocess.run([*router_cmd(cfg)[:3], "status", "-c", str(cfg)],
                              capture_output=True, text=True, timeout=60).stdout
        assert "signals: 4 recorded (1 accepted, 3 refused); the last 4:" in text, text
        assert "accepted, route " + name + f", table public.{name}, where id % 10" in text
    finally:
        teardown(pg, name)


def test_many_signals_in_one_transaction_are_recorded_together(pg_dsn, kafka_bootstrap,
                                                               tmp_path):
    """400 signals of one transaction: each recorded accepted, merged into one backfill (their
    records go out in one batch: bench figures, not this test, say what that saves)."""
    pg, name, cfg = signal_source(pg_dsn, kafka_bootstrap, tmp_path, "sigm")
    try:
        run_router(cfg)  # the slot, no snapshot
        pg.run("insert into pgrouter.signals (route, \"table\", slot) select %s, %s, %s "
               "from generate_series(1, 400)", name, f"public.{name}", name)
        done = run_router(cfg)  # waits for the backfill (--until-caught-up)
        assert snapshot_ids(kafka_bootstrap, name) == list(range(1, ROWS + 1)), done.stderr
        states = [s for s, _ in signal_states(kafka_bootstrap, name).values()]
        assert states == ["accepted"] * 400
        assert done.stderr.count("signal accepted") == 400
        assert done.stderr.count("backfill requested") == 1, done.stderr[-3000:]
    finally:
        teardown(pg, name)


SIGNAL = 'insert into pgrouter.signals (route, "table", slot, "where") values (%s, %s, %s, %s)'


def signal_summary(cfg):
    """``pgrouter status --json``'s signals (read from the state topic by another process)."""
    out = subprocess.run([*router_cmd(cfg)[:3], "status", "-c", str(cfg), "--json"],
                         capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)["signals"]


def test_a_signal_for_a_table_being_backfilled_runs_after_it(pg_dsn, kafka_bootstrap,
                                                             tmp_path):
    """A signal for a table whose backfill runs waits and is copied after it (it was recorded
    accepted and copied nothing); one for the same rows as a waiting one is merged into it."""
    pg, name, cfg = signal_source(pg_dsn, kafka_bootstrap, tmp_path, "sigq")
    try:
        run_router(cfg)  # the slot, no snapshot
        pg.run(SIGNAL, name, f"public.{name}", name, None)  # the whole table: runs first
        # in one transaction: the first waits for it, the second is merged into the first
        pg.run(SIGNAL.replace("(%s, %s, %s, %s)", "(%s, %s, %s, %s), (%s, %s, %s, %s)"),
               name, f"public.{name}", name, "id <= 5", name, f"public.{name}", name, "id <= 5")
        pg.run(SIGNAL, name, f"public.{name}", name, "id <= 5")  # merged into the waiting one
        done = run_router(cfg)  # waits for the backfills (--until-caught-up)
        assert snapshot_ids(kafka_bootstrap, name) == sorted(
            [*range(1, ROWS + 1), *range(1, 6)]), done.stderr[-3000:]
        assert done.stderr.count("signal queued") == 1, done.stderr[-3000:]
        assert done.stderr.count("backfill requested") == 2, done.stderr[-3000:]
        assert [s for s, _ in signal_states(kafka_bootstrap, name).values()] == ["accepted"] * 4
        assert signal_summary(cfg)["states"] == {"accepted": 4}
    finally:
        teardown(pg, name)


def test_a_queued_signal_outlives_a_restart(pg_dsn, kafka_bootstrap, tmp_path):
    """The first backfill cannot read (the table is locked), a second signal for the table
    waits: `status` says queued; the router is killed; at the next start the first resumes
    and the queued one runs after it."""
    import os
    import signal as signals

    import psycopg2

    pg, name, cfg = signal_source(pg_dsn, kafka_bootstrap, tmp_path, "sigr")
    log = tmp_path / "router.log"
    locker = psycopg2.connect(pg_dsn)
    router = None
    try:
        run_router(cfg)  # the slot, no snapshot
        with locker.cursor() as cur:
            cur.execute(f"lock table {name} in access exclusive mode")  # held: no chunk reads
        router = start_router(cfg, log)
        pg.run(SIGNAL, name, f"public.{name}", name, None)
        pg.run(SIGNAL, name, f"public.{name}", name, "id > 50")
        wait_line("signal queued", log, router)
        summary = signal_summary(cfg)
        assert summary["states"] == {"accepted": 1, "queued": 1}, summary
        assert [(s["state"], s["where"]) for s in summary["last"]] == [
            ("accepted", None), ("queued", "id > 50")], summary
        os.killpg(router.pid, signals.SIGKILL)
        router.wait(timeout=30)
        router = None
        locker.rollback()  # the lock goes
        done = run_router(cfg)
        assert snapshot_ids(kafka_bootstrap, name) == sorted(
            [*range(1, ROWS + 1), *range(51, ROWS + 1)]), done.stderr[-3000:]
        assert signal_summary(cfg)["states"] == {"accepted": 2}
        run_router(cfg)  # neither is acted upon again
        assert len(snapshot_ids(kafka_bootstrap, name)) == ROWS + 10
    finally:
        if router is not None:
            os.killpg(router.pid, signals.SIGKILL)
            router.wait(timeout=30)
        locker.close()
        teardown(pg, name)


def test_a_signal_merges_into_an_earlier_transactions_job_not_started(pg_dsn, kafka_bootstrap,
                                                                      tmp_path):
    """docs/snapshots.md: a signal for the same rows as a job planned and not started yet is
    merged into it. With one driver (``parallel = 1``) held by a backfill of a locked table,
    two signals for another table in two transactions: the second is merged into the first's
    job still queued for the driver (``accepted``), and the table is copied once (it was
    ``queued`` and the table copied twice: signals merged within a transaction only)."""
    import threading

    import psycopg2

    name = unique("sigm")
    held = f"{name}_l"
    pg = Pg(pg_dsn)
    for stmt in SETUP_SQL:
        pg.run(stmt)
    for table in (name, held):
        pg.run(f"create table {table} (id int primary key, v text)")
        pg.run(f"insert into {table} select g, 'v' || g from generate_series(1, {ROWS}) g")
    pg.run(f"create publication {name} for table {name}, {held}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        extra='[snapshot]\nmode = "never"\nparallel = 1\n',
                        routes=f'[[routes]]\nname = "{name}"\n'
                               f'tables = ["public.{name}", "public.{held}"]\n')
    locker = psycopg2.connect(pg_dsn)
    proc = None
    try:
        run_router(cfg)  # the slot, no snapshot
        with locker.cursor() as cur:
            cur.execute(f"lock table {held} in access exclusive mode")  # the driver waits
        pg.run(SIGNAL, name, f"public.{held}", name, None)  # takes the one driver
        pg.run(SIGNAL, name, f"public.{name}", name, None)  # queued for the driver
        pg.run(SIGNAL, name, f"public.{name}", name, None)  # the same rows: merged
        proc = subprocess.Popen(router_cmd(cfg, "--until-caught-up"), cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        err: list[str] = []
        reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
        reader.start()
        deadline = time.monotonic() + 90
        while sum(1 for line in list(err) if "signal accepted" in line
                  or "signal queued" in line) < 3:
            assert time.monotonic() < deadline, "".join(err)[-3000:]
            assert proc.poll() is None, "".join(err)[-3000:]
            time.sleep(0.2)
        locker.rollback()  # the lock goes: the backfills run
        assert proc.wait(timeout=120) == 0, "".join(err)[-3000:]
        reader.join(timeout=10)
        text = "".join(err)
        assert "signal queued" not in text, text[-3000:]
        assert text.count("backfill requested") == 2, text[-3000:]
        assert snapshot_ids(kafka_bootstrap, f"{name}.public.{name}") == list(
            range(1, ROWS + 1)), text[-3000:]
        assert snapshot_ids(kafka_bootstrap, f"{name}.public.{held}") == list(
            range(1, ROWS + 1)), text[-3000:]
        assert [s for s, _ in signal_states(kafka_bootstrap, name).values()] == ["accepted"] * 3
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        locker.close()
        pg.drop_slot(name)
        pg.run("delete from pgrouter.signals where slot = %s", name)
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}, {held}")
        pg.close()
