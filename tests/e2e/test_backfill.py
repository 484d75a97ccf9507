"""Backfills while streaming, on the real stack.

A router streams a table into two routes; a writer keeps inserting, updating (also keys) and
deleting rows; ``pgrouter snapshot --route new`` backfills the table into one route. Folded,
that route's topic equals the table, and the other route's topic got no snapshot record —
also when the router is killed with ``kill -9`` in the middle of the backfill and started
again (then at most one chunk is written twice).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import psycopg2
import pytest

from tests.helpers import (ROOT, Pg, fold_rows, kill9, pg_text, read_topic, start_router,
                           stop_router, unique, wait_logged, write_config)

pytestmark = pytest.mark.services

DEADLINE = 120
CHUNK = 25
COLS = ["id", "v", "n", "f", "b", "j", "ts", "arr", "flag"]


class Writer(threading.Thread):
    """Random inserts, updates (of one row, of a slice of the table, of keys) and deletes
    until stopped."""

    def __init__(self, dsn: str, table: str):
        super().__init__(daemon=True)
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        self.table = table
        self.stop = threading.Event()
        self.ops = 0
        self.rng = random.Random(7)

    def run(self) -> None:
        t, rng = self.table, self.rng
        with self.conn.cursor() as cur:
            while not self.stop.is_set():
                k = rng.randrange(1, 1600)
                op = rng.random()
                if op < 0.25:  # many keys at once: windows catch changes to chunk rows
                    cur.execute(f"update {t} set n = n + 1 where id %% 11 = %s", (k % 11,))
                elif op < 0.4:
                    cur.execute(f"insert into {t} values (%s, 'w', %s) on conflict (id) do "
                                "update set v = 'upsert'", (k, k))
                elif op < 0.6:
                    cur.execute(f"update {t} set v = v || '+', n = n + 1 where id = %s", (k,))
                elif op < 0.75:
                    cur.execute(f"update {t} set id = %s where id = %s and not exists "
                                f"(select 1 from {t} where id = %s)", (k + 1000, k, k + 1000))
                else:
                    cur.execute(f"delete from {t} where id = %s", (k,))
                self.ops += 1
                time.sleep(0.002)
        self.conn.close()


def progress(bootstrap: str, slot: str) -> list[dict]:
    return [r["value"] for r in read_topic(bootstrap, "pgrouter.snapshots")
            if r["value"].get("slot") == slot and r["value"]["kind"] == "backfill"]


def frozen_in_the_middle(proc: subprocess.Popen, bootstrap: str, slot: str) -> bool:
    """Freeze the router and read its backfill's progress: True (left frozen) when a few
    chunks are done and the backfill is not, else thawed and False."""
    os.killpg(proc.pid, signal.SIGSTOP)
    states = progress(bootstrap, slot)
    if (any(p["state"] == "running" and p.get("rows", 0) >= 4 * CHUNK for p in states)
            and not any(p["state"] == "done" for p in states)):
        return True
    os.killpg(proc.pid, signal.SIGCONT)
    return False


def wait_for(what: str, cond, log, timeout: float = DEADLINE):
    return wait_logged(what, cond, log, timeout)


def wait_caught_up(pg: Pg, slot: str, log) -> None:
    """Until the slot confirmed the server's WAL position of now."""
    lsn = pg.one("select pg_current_wal_lsn()::text")
    wait_for("the router to catch up", lambda: pg.one(
        "select confirmed_flush_lsn >= %s::pg_lsn from pg_replication_slots where "
        "slot_name = %s", lsn, slot), log)


def stop_and_drop(proc: subprocess.Popen, pg: Pg, slot: str) -> None:
    """The router stopped (SIGTERM, kill -9 after 30 s) and its slot dropped."""
    stop_router(proc)
    pg.drop_slot(slot)


def snapshot_cmd(cfg, route: str, table: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "actors.cli", "snapshot", "-c", str(cfg),
                           "--route", route, "--table", table], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


@pytest.mark.parametrize("crash", [False, True], ids=["steady", "kill9"])
def test_backfill_of_one_route_under_concurrent_writes(pg_dsn, kafka_bootstrap, tmp_path,
                                                       crash):
    pg = Pg(pg_dsn)
    u = unique("bf")
    t, nokey = f"t_{u}", f"nk_{u}"
    pg.run(f"create table {t}(id int primary key, v text, n int, f float8 default 0.25, "
           "b bytea default '\\x00ff', j jsonb default '{\"a\": [1, \"x\\ty\"]}', "
           "ts timestamptz default '2026-01-01 00:00:00.123456+00', "
           "arr text[] default '{a,\"b c\",NULL}', flag bool default true)")
    pg.run(f"create table {nokey}(a int)")
    pg.run(f"insert into {t}(id, v, n, f, flag) select g, case when g % 9 = 0 then null else "
           f"'v' || g || E'\\t\\\\' end, g, g + 0.5, g % 2 = 0 from generate_series(1, 1500) g")
    pg.run(f"create publication sp_{u} for table {t}, {nokey}")
    slot = f"{u}_router"
    routes = f"""
[[routes]]
name = "old_{u}"
tables = ["{t}", "{nokey}"]

[[routes]]
name = "new_{u}"
tables = ["{t}", "{nokey}"]
"""
    cfg = write_config(tmp_path / "router.toml", dsn=pg_dsn, slot=slot,
                       publications=[f"sp_{u}"], bootstrap=kafka_bootstrap, routes=routes,
                       extra=f"[snapshot]\nmode = \"never\"\nchunk_rows = {CHUNK}\n")
    log = tmp_path / "router.log"
    proc = start_router(cfg, log)
    writer = Writer(pg_dsn, t)
    try:
        wait_for("the slot", lambda: pg.run("select 1 from pg_replication_slots where "
                                            "slot_name = %s and active", slot), log)
        writer.start()
        time.sleep(0.5)
        # a keyless table is refused, and nothing is requested
        refused = snapshot_cmd(cfg, f"new_{u}", nokey)
        assert refused.returncode == 1 and "no primary key" in refused.stderr
        asked = snapshot_cmd(cfg, f"new_{u}", t)
        assert asked.returncode == 0, asked.stderr
        if crash:
            # a few chunks done (a restart from the beginning would write them all again):
            # the router is frozen while its progress is read (reading the shared progress
            # topic can outlast the rest of the backfill), killed when it is in the middle
            wait_for("chunks done", lambda: frozen_in_the_middle(proc, kafka_bootstrap, slot),
                     log)
            kill9(proc)
            # killed in the middle: the backfill is not done
            assert not any(p["state"] == "done" for p in progress(kafka_bootstrap, slot))
            proc = start_router(cfg, log)
        wait_for("the backfill", lambda: any(p["state"] == "done" and p["table"] ==
                                             f"public.{t}"
                                             for p in progress(kafka_bootstrap, slot)), log)
        writer.stop.set()
        writer.join(timeout=30)
        wait_caught_up(pg, slot, log)
    finally:
        writer.stop.set()
        stop_and_drop(proc, pg, slot)
    assert writer.ops > 50
    recs = read_topic(kafka_bootstrap, f"new_{u}.public.{t}")
    folded = fold_rows(recs, ["id"])
    got = {tuple(pg_text(r.get(c)) for c in COLS) for r in folded.values()}
    with pg.conn.cursor() as cur:
        cur.execute(f"select {', '.join(c + '::text' for c in COLS)} from {t}")
        want = set(cur.fetchall())
    assert got == want, sorted(got ^ want)[:20]
    snap = [r for r in recs if r["value"]["op"] == "r"]
    assert snap
    keys = [json.dumps(r["key"]) for r in snap]
    assert len(keys) - len(set(keys)) <= (CHUNK if crash else 0)
    old = read_topic(kafka_bootstrap, f"old_{u}.public.{t}")
    assert old and all(r["value"]["op"] != "r" for r in old)
    assert "backfill: table done" in log.read_text()


def test_backfill_requested_while_the_router_is_down(pg_dsn, kafka_bootstrap, tmp_path):
    """A request waits in the WAL; ``pgrouter run --until-caught-up`` backfills it before it
    exits."""
    from tests.helpers import run_router

    pg = Pg(pg_dsn)
    u = unique("bfd")
    t = f"t_{u}"
    pg.run(f"create table {t}(k text, n int, v text, primary key (k, n))")
    pg.run(f"insert into {t} select 'k' || (g % 7), g, 'v' || g from generate_series(1, 90) g")
    pg.run(f"create publication sp_{u} for table {t}")
    slot = f"{u}_router"
    cfg = write_config(tmp_path / "router.toml", dsn=pg_dsn, slot=slot,
                       publications=[f"sp_{u}"], bootstrap=kafka_bootstrap,
                       routes=f'[[routes]]\nname = "r_{u}"\ntables = ["{t}"]\n',
                       extra="[snapshot]\nmode = \"never\"\nchunk_rows = 10\n")
    try:
        run_router(cfg)  # creates the slot, no snapshot
        assert read_topic(kafka_bootstrap, f"r_{u}.public.{t}", missing_ok=True,
                          settle=0) == []  # the router has exited
        asked = snapshot_cmd(cfg, f"r_{u}", t)
        assert asked.returncode == 0, asked.stderr
        assert "key=k,n" in asked.stdout
        pg.run(f"delete from {t} where n < 10")
        proc = run_router(cfg)
        assert "backfill: table done" in proc.stderr
    finally:
        pg.drop_slot(slot)
    folded = fold_rows(read_topic(kafka_bootstrap, f"r_{u}.public.{t}"), ["k", "n"])
    with pg.conn.cursor() as cur:
        cur.execute(f"select k, n, v from {t}")
        want = {(k, n, v) for k, n, v in cur.fetchall()}
    assert {(r["k"], r["n"], r["v"]) for r in folded.values()} == want


def test_snapshot_requests_no_router_would_read_are_refused(pg_dsn, kafka_bootstrap, tmp_path):
    """Before the slot exists, a request would lie in WAL the slot never decodes: refused
    with one line, nothing written. A table the route does not take is refused by name, not
    silently left out of a request that names other tables."""
    pg = Pg(pg_dsn)
    u = unique("bfr")
    a, b = f"a_{u}", f"b_{u}"
    pg.run(f"create table {a}(id int primary key)")
    pg.run(f"create table {b}(id int primary key)")
    pg.run(f"create publication sp_{u} for table {a}, {b}")
    slot = f"{u}_router"
    cfg = write_config(tmp_path / "router.toml", dsn=pg_dsn, slot=slot,
                       publications=[f"sp_{u}"], bootstrap=kafka_bootstrap,
                       routes=f'[[routes]]\nname = "r_{u}"\ntables = ["public.{a}"]\n',
                       extra="[snapshot]\nmode = \"never\"\n")
    try:
        asked = snapshot_cmd(cfg, f"r_{u}", a)
        assert asked.returncode == 1, asked.stdout + asked.stderr
        assert "backfill requested" not in asked.stdout
        lines = asked.stderr.strip().splitlines()
        assert len(lines) == 1 and f"replication slot '{slot}' does not exist" in lines[0], \
            asked.stderr

        from tests.helpers import run_router
        run_router(cfg)  # the slot now exists
        asked = subprocess.run([sys.executable, "-m", "actors.cli", "snapshot", "-c", str(cfg),
                                "--route", f"r_{u}", "--table", a, "--table", b],
                               capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert asked.returncode == 1, asked.stdout + asked.stderr
        assert "backfill requested" not in asked.stdout
        assert asked.stderr.strip() == (f"pgrouter snapshot: route 'r_{u}' does not take "
                                        f"table public.{b}"), asked.stderr
        ok = snapshot_cmd(cfg, f"r_{u}", a)
        assert ok.returncode == 0 and f"table=public.{a}" in ok.stdout, ok.stderr
    finally:
        pg.drop_slot(slot)
        pg.run(f"drop publication sp_{u}")
        pg.run(f"drop table {a}, {b}")


class Toucher(threading.Thread):
    """Updates one row every 2 ms without touching its TOASTed column, until stopped."""

    def __init__(self, dsn: str, table: str, key: int):
        super().__init__(daemon=True)
        self.dsn, self.table, self.key = dsn, table, key
        self.stop = threading.Event()
        self.ops = 0

    def run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            while not self.stop.is_set():
                cur.execute(f"update {self.table} set n = n + 1 where id = %s", (self.key,))
                self.ops += 1
                time.sleep(0.002)
        conn.close()


def test_backfill_keeps_unchanged_toast_values_of_rows_updated_in_their_window(
        pg_dsn, kafka_bootstrap, tmp_path):
    """A row whose out-of-line TOASTed value is left unchanged by updates inside its chunk's
    window: the streamed updates name it in unchanged_toast only, so the backfill must emit
    the value (the row was dropped from the chunk, and the topic never carried it)."""
    pg = Pg(pg_dsn)
    u = unique("bft")
    t = f"t_{u}"
    pg.run(f"create table {t}(id int primary key, n int, blob text)")
    pg.run(f"alter table {t} alter blob set storage external")
    pg.run(f"insert into {t} select g, 0, 'b' || g from generate_series(1, 10000) g")
    big = "".join(chr(65 + (i * 7) % 26) for i in range(22000))
    pg.run(f"update {t} set blob = %s where id = 5000", big)
    pg.run(f"create publication sp_{u} for table {t}")
    slot = f"{u}_router"
    cfg = write_config(tmp_path / "router.toml", dsn=pg_dsn, slot=slot,
                       publications=[f"sp_{u}"], bootstrap=kafka_bootstrap,
                       routes=f'[[routes]]\nname = "r_{u}"\ntables = ["{t}"]\n',
                       extra="[snapshot]\nmode = \"never\"\nchunk_rows = 1000\n")
    log = tmp_path / "router.log"
    proc = start_router(cfg, log)
    toucher = Toucher(pg_dsn, t, 5000)
    try:
        wait_for("the slot", lambda: pg.run("select 1 from pg_replication_slots where "
                                            "slot_name = %s and active", slot), log)
        toucher.start()
        time.sleep(0.3)
        asked = snapshot_cmd(cfg, f"r_{u}", t)
        assert asked.returncode == 0, asked.stderr
        wait_for("the backfill", lambda: any(p["state"] == "done" and p["table"] ==
                                             f"public.{t}"
                                             for p in progress(kafka_bootstrap, slot)), log)
        toucher.stop.set()
        toucher.join(timeout=30)
        wait_caught_up(pg, slot, log)
    finally:
        toucher.stop.set()
        stop_and_drop(proc, pg, slot)
    assert toucher.ops > 50
    folded = fold_rows(read_topic(kafka_bootstrap, f"r_{u}.public.{t}", timeout=120), ["id"])
    with pg.conn.cursor() as cur:
        cur.execute(f"select id, n, blob from {t}")
        want = {(i, n, b) for i, n, b in cur.fetchall()}
    got = {(r["id"], r["n"], r["blob"]) for r in folded.values()}
    assert len(got) == 10000
    row = folded[(5000,)]
    assert row["blob"] == big, f"id 5000 carries blob {str(row['blob'])[:40]!r}"
    assert got == want, sorted(got ^ want)[:5]
    pg.run(f"drop publication sp_{u}")
    pg.run(f"drop table {t}")
