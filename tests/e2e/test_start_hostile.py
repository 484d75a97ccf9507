"""``pgrouter run``'s start on a hostile source: a slot someone made with another plugin, a
slot of the same name in another database, a publication with an odd name, an initial
snapshot of an empty table with DDL at its start, a second router on the same config, and
``status``/``check`` while a router runs; each refusal is one line naming what and where."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.e2e.sources import drop_made, new_table, source_config, table_route
from tests.helpers import (ROOT, Pg, fold_rows, kill9, read_topic, run_router, start_router,
                           unique, write_config)

pytestmark = pytest.mark.services


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture
def source(pg_dsn, kafka_bootstrap, tmp_path):
    pg, name = new_table(pg_dsn, "sth", "id int primary key, v text")
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        routes=table_route(name, "{route}"))
    yield pg, name, cfg
    drop_made(pg, name)


def _one_line_refusal(proc: subprocess.CompletedProcess, *words: str) -> str:
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for w in words:
        assert w in last, last
    return last


def test_a_slot_made_by_hand_with_test_decoding_is_refused(source):
    pg, name, cfg = source
    pg.run("select pg_create_logical_replication_slot(%s, 'test_decoding')", name)
    _one_line_refusal(_cli("run", "-c", str(cfg), "--until-caught-up"), name, "test_decoding")
    assert pg.one("select plugin from pg_replication_slots where slot_name = %s",
                  name) == "test_decoding", "the slot someone else made is left alone"


def test_a_slot_of_the_same_name_in_another_database(source, pg_dsn):
    pg, name, cfg = source
    other = f"{name}_db"
    pg.run(f"create database {other}")
    try:
        odsn = pg_dsn.rsplit("/", 1)[0] + "/" + other
        o = Pg(odsn)
        o.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", name)
        o.close()
        _one_line_refusal(_cli("run", "-c", str(cfg), "--until-caught-up"), name, other)
    finally:
        pg.run("select pg_drop_replication_slot(%s)", name)
        pg.run(f"drop database {other} with (force)")


@pytest.mark.parametrize("pub", ['a,b "quoted" Pub', "ünï cödé.dot", "back\\slash", "it's"])
def test_an_odd_publication_name_streams(pg_dsn, kafka_bootstrap, tmp_path, pub):
    """The initial snapshot and the stream of a publication whose name holds a comma, double
    or single quotes, a backslash or non-ASCII letters (psycopg2's start_replication sent
    ``ünï`` as ``?n?``: PostgreSQL 18 skipped the missing publication with a warning and
    the router confirmed past the changes it never got)."""
    pg = Pg(pg_dsn)
    name = unique("stp")
    quoted = '"' + pub.replace('"', '""') + '"'
    pg.run(f"create table {name} (id int primary key, v text)")
    pg.run(f"create publication {quoted} for table {name}")
    cfg = write_config(tmp_path / "r.toml", dsn=pg_dsn, slot=name, publications=[pub],
                       bootstrap=kafka_bootstrap,
                       routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\ntopic = "{{route}}"\n',
                       extra='[snapshot]\nmode = "initial"\n')
    try:
        pg.run(f"insert into {name} values (1, 'before')")
        run_router(cfg)
        pg.run(f"insert into {name} values (2, 'after')")
        pg.run(f"update {name} set v = 'changed' where id = 1")
        run_router(cfg)
        assert _cli("check", "-c", str(cfg)).returncode == 0
        assert _cli("status", "-c", str(cfg)).returncode == 0
        recs = read_topic(kafka_bootstrap, f"{name}", settle=0)
        rows = {k[0]: r["v"] for k, r in fold_rows(recs, ["id"]).items()}
        assert rows == {1: "changed", 2: "after"}
    finally:
        pg.drop_slot(name)
        pg.run(f"drop publication {quoted}")
        pg.run(f"drop table {name}")
        pg.close()


def test_initial_snapshot_of_an_empty_table_with_ddl_at_start(source, kafka_bootstrap):
    pg, name, cfg = source
    cfg.write_text(cfg.read_text() + '\n[snapshot]\nmode = "initial"\n')
    log = cfg.parent / "r.log"
    router = start_router(cfg, log)
    try:
        pg.run(f"alter table {name} add column w int default 5")
        pg.run(f"insert into {name} values (1, 'a', 1)")
        pg.run(f"alter table {name} drop column v")
        pg.run(f"insert into {name} values (2, 2)")
        pg.run(f"truncate {name}")
        pg.run(f"insert into {name} values (3, 3)")
    finally:
        time.sleep(3)
        kill9(router)
    run_router(cfg)
    recs = read_topic(kafka_bootstrap, name, settle=0)
    rows = {k[0]: r.get("w") for k, r in fold_rows(recs, ["id"]).items()}
    assert rows == {3: 3}, log.read_text()[-3000:]


def _wait_for(log, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.1)


@pytest.mark.parametrize("exactly_once", [False, True])
def test_a_second_router_on_the_same_config_waits_then_leaves_the_first_alone(
        source, kafka_bootstrap, exactly_once):
    """While one router streams, a second on the same config, ``status`` and ``check`` run:
    the second is refused in one line, the first is neither fenced nor stopped."""
    pg, name, cfg = source
    if exactly_once:
        cfg.write_text(cfg.read_text().replace("[kafka]\n", "[kafka]\nexactly_once = true\n"))
    first = start_router(cfg, cfg.parent / "first.log")
    try:
        _wait_for(cfg.parent / "first.log", "streaming started")
        pg.run(f"insert into {name} select g, 'a' from generate_series(1, 100) g")
        second = _cli("run", "-c", str(cfg), "--until-caught-up")
        _one_line_refusal(second, name, "in use")
        status = _cli("status", "-c", str(cfg))
        assert status.returncode == 0, status.stderr[-2000:]
        check = _cli("check", "-c", str(cfg))  # a finding, with its key, not a failure
        assert check.returncode == 1 and check.stdout.startswith("source.slot: "), check
        assert "in use" in check.stdout and "Traceback" not in check.stderr
        pg.run(f"insert into {name} select g, 'b' from generate_series(101, 200) g")
        deadline = time.monotonic() + 60
        while len(read_topic(kafka_bootstrap, name, missing_ok=True, settle=0)) < 200:
            assert first.poll() is None, (cfg.parent / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first router stopped delivering"
            time.sleep(0.2)
    finally:
        kill9(first)
    run_router(cfg)
    rows = fold_rows(read_topic(kafka_bootstrap, name, settle=0), ["id"])
    assert len(rows) == 200


def test_slot_dropped_by_hand_while_streaming_stops_in_one_line(source, kafka_bootstrap):
    pg, name, cfg = source
    log = cfg.parent / "r.log"
    router = start_router(cfg, log)
    try:
        _wait_for(log, "streaming started")
        pid = pg.one("select active_pid from pg_replication_slots where slot_name = %s", name)
        pg.run("select pg_terminate_backend(%s)", pid)
        deadline = time.monotonic() + 30
        while True:  # the router reconnects at once: drop it in the gap
            try:
                pg.run("select pg_drop_replication_slot(%s)", name)
                break
            except Exception:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        code = router.wait(timeout=120)
    finally:
        kill9(router)
    text = log.read_text(errors="replace")
    assert code != 0 and "Traceback" not in text, text[-3000:]


@pytest.fixture
def two_tables(pg_dsn, kafka_bootstrap, tmp_path):
    """A source of two tables for an initial snapshot copied by one session: ``_a`` (big)
    first, then ``_b``; (pg, slot name, a, b, config)."""
    pg = Pg(pg_dsn)
    name = unique("stc")
    a, b = f"{name}_a", f"{name}_b"
    for t, n in ((a, 100_000), (b, 3000)):
        pg.run(f"create table {t} (id int primary key, v text)")
        pg.run(f"insert into {t} select g, repeat('v', 40) from generate_series(1, {n}) g")
    pg.run(f"create publication {name} for table {a}, {b}")
    routes = "".join(f'[[routes]]\nname = "{t}"\ntables = ["public.{t}"]\ntopic = "{{route}}"\n'
                     for t in (a, b))
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name, routes=routes,
                        extra='[snapshot]\nmode = "initial"\nparallel = 1\n')
    yield pg, name, a, b, cfg
    pg.drop_slot(name)
    pg.run(f"drop publication if exists {name}")
    for t in (a, b):
        pg.run(f"drop table if exists {t}")
    pg.close()
    from tests.e2e.guarantee import delete_topics

    delete_topics(kafka_bootstrap, [a, b])  # 100,000 records each run


def _copy_paused(pg: Pg, b: str, proc, log):
    """Once the router made its slot with an exported snapshot, an ACCESS EXCLUSIVE lock on
    ``b`` (the second table), taken before the copy reached it (its reader keeps the lock of
    a table it read until the copy ends: a lock this session gets at once proves it did not),
    and held until the reader waits for it: a point the copy cannot pass. Taken after the
    export: the lock's transaction id would hold up the slot's creation (everyone's). The
    lock's session is returned; ``rollback`` lets the copy go on."""
    import psycopg2

    _wait_for(log, "replication slot created with an exported snapshot")
    conn = psycopg2.connect(pg.dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("set lock_timeout = '5s'")
            cur.execute(f"lock table {b} in access exclusive mode")
        deadline = time.monotonic() + 60
        while not pg.one("select count(*) from pg_locks where relation = %s::regclass "
                         "and not granted", b):
            assert time.monotonic() < deadline and proc.poll() is None, \
                log.read_text(errors="replace")[-3000:]
            time.sleep(0.1)
    except BaseException:
        conn.close()
        raise
    return conn


def _rows(bootstrap: str, topic: str) -> int:
    return len(fold_rows(read_topic(bootstrap, topic, missing_ok=True, settle=0), ["id"]))


@pytest.mark.parametrize("exactly_once", [False, True])
def test_a_second_router_while_the_first_copies_its_initial_snapshot(
        two_tables, kafka_bootstrap, exactly_once):
    """The first router frozen (SIGSTOP) while it copies its initial snapshot (its reader
    waits for a lock on the second table, so the copy has not finished): a second on the
    same config sees it busy (its exporting connection, ``slots.copy_name``) and is refused
    in one line, in both delivery modes (at-least-once it streamed the slot beside the copy
    and finished the snapshot by backfill). Thawed, the first finishes and streams."""
    import os
    import signal

    pg, name, a, b, cfg = two_tables
    if exactly_once:
        cfg.write_text(cfg.read_text().replace("[kafka]\n", "[kafka]\nexactly_once = true\n"))
    log = cfg.parent / "first.log"
    first = start_router(cfg, log)
    lock = None
    try:
        lock = _copy_paused(pg, b, first, log)
        os.killpg(first.pid, signal.SIGSTOP)
        try:
            lock.rollback()
            second = _cli("run", "-c", str(cfg), "--until-caught-up")
        finally:
            os.killpg(first.pid, signal.SIGCONT)
        _one_line_refusal(second, name, "in use")
        _wait_for(log, "streaming started", timeout=90)
        pg.run(f"insert into {b} values (3001, 'streamed')")
        deadline = time.monotonic() + 60
        while [_rows(kafka_bootstrap, t) for t in (a, b)] != [100_000, 3001]:
            assert first.poll() is None and time.monotonic() < deadline, \
                log.read_text()[-3000:]
            time.sleep(0.5)
    finally:
        if lock is not None:
            lock.close()
        kill9(first)
    assert "fenced" not in log.read_text(), log.read_text()[-3000:]


def test_exactly_once_initial_snapshot_spanning_kafka_transactions_and_a_freeze(
        two_tables, kafka_bootstrap):
    """Exactly-once: the first table is copied and committed to Kafka, the reader then waits
    for a lock the test holds on the second; the router is frozen (SIGSTOP) there, the lock
    let go, the router thawed. Every snapshot chunk ends at the slot's consistent point, and
    the sink took the progress its own first commit wrote for what Kafka held before the
    run: every later chunk was skipped as "already in Kafka" (the second table's rows never
    sent; 2,887 of 50,000 rows after a 30 s freeze in one table) and the snapshot never
    finished (its tickets never added up): no stream, and SIGINT did not drain it. Both
    tables and a streamed change must reach Kafka."""
    import os
    import signal

    pg, name, a, b, cfg = two_tables
    cfg.write_text(cfg.read_text().replace("[kafka]\n", "[kafka]\nexactly_once = true\n"))
    log = cfg.parent / "r.log"
    router = start_router(cfg, log)
    lock = None
    try:
        lock = _copy_paused(pg, b, router, log)
        done = {"kind": "backfill", "slot": name, "route": a, "table": f"public.{a}"}
        deadline = time.monotonic() + 60
        while not any(r["key"] == done and r["value"]["state"] == "done"
                      for r in read_topic(kafka_bootstrap, "pgrouter.snapshots", settle=0)):
            # the first table recorded done: its Kafka transactions committed
            assert time.monotonic() < deadline and router.poll() is None, \
                log.read_text()[-3000:]
            time.sleep(0.5)
        os.killpg(router.pid, signal.SIGSTOP)
        try:
            lock.rollback()
            time.sleep(5)
        finally:
            os.killpg(router.pid, signal.SIGCONT)
        _wait_for(log, "streaming started", timeout=90)
        pg.run(f"insert into {b} values (3001, 'streamed')")
        deadline = time.monotonic() + 60
        while [_rows(kafka_bootstrap, t) for t in (a, b)] != [100_000, 3001]:
            assert time.monotonic() < deadline and router.poll() is None, \
                log.read_text()[-3000:]
            time.sleep(0.5)
    finally:
        if lock is not None:
            lock.close()
        kill9(router)
    assert "skipping source transactions" not in log.read_text(), log.read_text()[-3000:]
