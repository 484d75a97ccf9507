"""Publication changes take effect at their WAL position, against PostgreSQL's own pgoutput.

DML interleaved with ALTER PUBLICATION — a row filter changed, a column list changed, a table
added and dropped, the publish actions changed, ``publish_via_partition_root`` toggled, a
replica identity changed, a table attached as a partition and detached again, and an ALTER
inside a transaction between two changes — on one
slot with one route per publication, the event trigger of ``pgrouter setup`` installed. Run
three ways: (1) the router live, (2) the router started only after all of it, (3) the router
killed with ``kill -9`` before each ALTER group and started again after it, so every start
lies behind an ALTER the catalog already shows.

The oracle is what a subscription of each publication receives: the walsender's pgoutput
stream for that publication alone, read through one extra slot per publication created with
the router's slot (``pg_logical_slot_get_binary_changes``, the same decoding a subscription's
walsender does). A subscriber's apply worker itself is not the oracle because it skips
changes of a table added to its publication until ``ALTER SUBSCRIPTION … REFRESH
PUBLICATION``, which is not what the publication replicates. Each topic's sequence of
operations (table, op, old key, new row), ordered by position, must equal the oracle's.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from router.routing.definitions import PREFIX
from tests.e2e.pgoutput_oracle import slot_changes
from tests.helpers import (ROOT, Pg, database_dsn, kill9, pg_text, read_topic, run_router, start_router,
                           unique, write_config)

pytestmark = pytest.mark.services

DEADLINE = 120  # a start and a confirm on a loaded machine
OPS = {"insert": "c", "update": "u", "delete": "d"}

# route name -> (publication definition, ALTERs applied at each step, by step)
PUBS = {
    "pf": "FOR TABLE {t} WHERE (v > 10)",
    "pc": "FOR TABLE {w} (id, v)",
    "pt": "FOR TABLE {t}",
    "pa": "FOR TABLE {t}, {u} WITH (publish = 'insert')",
    "pr": "FOR TABLE {p} WITH (publish_via_partition_root = false)",
}


def steps(n: dict) -> list[tuple[str, list[str]]]:
    """(kind, statements): 'dml' runs each statement in its own transaction, 'alter' too,
    'txn' runs them as one transaction."""
    t, u, p, w, x = n["t"], n["u"], n["p"], n["w"], n["x"]
    return [
        ("dml", [f"insert into {t} values (1, 5, 'a'), (2, 50, 'b'), (3, 20, 'c')",
                 f"insert into {u} values (1, 5), (2, 50)",
                 f"insert into {w} values (1, 1, 'a'), (2, 2, 'b')",
                 f"insert into {x} values (1100, 11)",  # not a partition yet: in no publication
                 f"insert into {p} values (1, 5), (2, 50), (150, 7)",
                 f"update {t} set v = v + 1 where id = 1",
                 f"update {u} set v = 51 where id = 2"]),
        ("alter", [f"alter publication {n['pf']} set table {t} where (v < 10)",
                   f"alter publication {n['pc']} set table {w} (id, c)",
                   f"alter publication {n['pt']} add table {u}",
                   f"alter publication {n['pa']} set (publish = 'insert, update, delete')",
                   f"alter publication {n['pr']} set (publish_via_partition_root = true)",
                   f"alter table {p} attach partition {x} for values from (1000) to (2000)"]),
        ("dml", [f"insert into {t} values (4, 5, 'd'), (5, 50, 'e')",
                 f"update {t} set v = 7, c = 'x' where id = 2",
                 f"insert into {u} values (3, 8)",
                 f"update {w} set v = 3, c = 'y' where id = 1",
                 f"insert into {w} values (3, 3, 'c')",
                 f"update {u} set v = 9 where id = 1",
                 f"insert into {p} values (3, 5), (160, 60), (1200, 12)",
                 f"update {x} set v = 13 where id = 1100",
                 f"update {p} set v = 6 where id = 1",
                 f"delete from {t} where id = 1"]),
        ("txn", [f"insert into {t} values (6, 5, 'f')",
                 f"alter publication {n['pt']} drop table {t}",
                 f"alter publication {n['pf']} set table {t} where (v > 40)",
                 f"update {w} set v = 4 where id = 2",
                 f"alter publication {n['pc']} set table {w} (id, v, c)",
                 f"update {w} set v = 5 where id = 2",
                 f"insert into {t} values (7, 60, 'g'), (8, 6, 'h')",
                 f"update {u} set v = 10 where id = 3"]),
        ("dml", [f"update {t} set v = 70 where id = 4",
                 f"insert into {u} values (4, 44)",
                 f"delete from {u} where id = 2"]),
        ("alter", [f"alter publication {n['pa']} set (publish = 'insert, delete')",
                   f"alter publication {n['pr']} set (publish_via_partition_root = false)",
                   f"alter table {u} replica identity full",
                   f"alter table {p} detach partition {x}",
                   f"alter publication {n['pf']} set table {t} where (v > 40 or c = 'x')"]),
        ("dml", [f"update {t} set v = v + 100",
                 f"delete from {t} where id = 3",
                 f"update {u} set v = v + 1",
                 f"delete from {u} where id = 1",
                 f"insert into {p} values (4, 4), (170, 70)",
                 f"update {p} set v = v + 1 where id in (2, 160)",
                 f"delete from {p} where id = 3",
                 f"insert into {x} values (1300, 13)"]),  # detached: in no publication
    ]


def run_step(pg: Pg, kind: str, statements: list[str]) -> None:
    if kind == "txn":
        pg.run("; ".join(["begin", *statements, "commit"]))
    else:
        for s in statements:
            pg.run(s)


def oracle(pg: Pg, slot: str, pub: str) -> list[tuple]:
    """The operations pgoutput sends for ``pub``: (table, op, old tuple's non-NULL columns —
    the key, or the whole old row with REPLICA IDENTITY FULL —, new row), as text."""
    out = []
    for ch in slot_changes(pg, slot, pub):
        rel = ch.relation
        names = [c.name for c in rel.columns]
        old = None if ch.old is None else tuple(sorted(
            (n, v) for n, v in zip(names, ch.old) if v is not None))
        new = None if ch.new is None else tuple(sorted(zip(names, ch.new)))
        if ch.op == "delete":
            new = None
        out.append((rel.name, OPS[ch.op], old, new))
    return out


def existing_topics(bootstrap: str) -> set[str]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return set(consumer.topics())
    finally:
        consumer.close()


def topic_ops(bootstrap: str, route: str, tables: list[str], topics: set[str]) -> list[tuple]:
    """The route's records over all its topics, in position order, duplicates (a record
    sent again after a restart, byte for byte) removed."""
    seen, records = set(), []
    for table in tables:
        if f"{route}.public.{table}" not in topics:
            continue
        for r in read_topic(bootstrap, f"{route}.public.{table}", timeout=20):
            if r["raw"] in seen:
                continue
            seen.add(r["raw"])
            records.append((table, r["value"]))
    records.sort(key=lambda tr: (tr[1]["source"]["commit_lsn"], tr[1]["source"]["seq"]))
    out = []
    for table, v in records:
        before, after = v["before"], v["after"]
        old = None if before is None else tuple(sorted(
            (k, pg_text(x)) for k, x in before.items() if x is not None))
        new = None if after is None or v["op"] == "d" else tuple(sorted(
            (k, pg_text(x)) for k, x in after.items()))
        out.append((table, v["op"], old, new))
    return out


def wait_confirmed(pg: Pg, slot: str, lsn: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if pg.one("select confirmed_flush_lsn >= %s::pg_lsn from pg_replication_slots "
                  "where slot_name = %s", lsn, slot):
            return
        time.sleep(0.2)
    raise AssertionError(f"router did not confirm {lsn} on {slot}")


@pytest.fixture
def trigger_installed(pg_dsn, kafka_bootstrap, tmp_path):
    cfg = write_config(tmp_path / "setup.toml", dsn=pg_dsn, slot="unused_setup_slot",
                       publications=["none"], bootstrap=kafka_bootstrap,
                       routes='[[routes]]\nname = "none"\nall_tables = true\n',
                       source_extra="create_slot = false")
    cfg.write_text(cfg.read_text().replace("create_slot = true\n", ""))
    setup = [sys.executable, "-m", "actors.cli", "setup", "-c", str(cfg)]
    done = subprocess.run(setup, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "event trigger installed" in done.stdout
    yield
    subprocess.run([*setup, "--uninstall"], capture_output=True, timeout=60, cwd=ROOT)


@pytest.mark.parametrize("mode, client", [("live", "kafka-python"), ("after", "kafka-python"),
                                          ("kill9", "kafka-python"), ("kill9", "librdkafka")])
def test_publication_changes_at_their_wal_position(mode, client, trigger_installed, pg_dsn,
                                                   kafka_bootstrap, tmp_path):
    pg = Pg(pg_dsn)
    u = unique("pw")
    n = {x: f"{x}_{u}" for x in ("t", "u", "w", "x", "p", "p1", "p2")}
    n.update({k: f"{k}_{u}" for k in PUBS})
    pg.run(f"create table {n['t']} (id int primary key, v int, c text)")
    pg.run(f"alter table {n['t']} replica identity full")  # pf filters UPDATE/DELETE on v
    pg.run(f"create table {n['u']} (id int primary key, v int)")
    pg.run(f"create table {n['w']} (id int primary key, v int, c text)")
    pg.run(f"create table {n['x']} (id int primary key, v int)")
    pg.run(f"create table {n['p']} (id int primary key, v int) partition by range (id)")
    pg.run(f"create table {n['p1']} partition of {n['p']} for values from (0) to (100)")
    pg.run(f"create table {n['p2']} partition of {n['p']} for values from (100) to (1000)")
    for k, spec in PUBS.items():
        pg.run(f"create publication {n[k]} " + spec.format(**n))
    pg.run(f"create publication sp_{u} for table {n['t']}, {n['u']}, {n['w']}, {n['p']}")
    slot = f"{u}_router"
    oracle_slots = {k: f"{u}_{k}" for k in PUBS}
    routes = "".join(f'\n[[routes]]\nname = "r{k}_{u}"\npublication = "{n[k]}"\n' for k in PUBS)
    cfg = write_config(tmp_path / "router.toml", dsn=pg_dsn, slot=slot,
                       publications=[f"sp_{u}"], bootstrap=kafka_bootstrap, routes=routes,
                       source_extra='publication_changes = "wal"',
                       kafka_extra=f'definitions_topic = "defs_{u}"\nclient = "{client}"')
    proc = None
    try:
        for s in [slot, *oracle_slots.values()]:
            pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", s)
        if mode == "live":
            proc = start_router(cfg, tmp_path / "router.log")
        for kind, statements in steps(n):
            if mode == "kill9" and kind != "dml":
                if proc is not None:  # behind this ALTER at the next start
                    kill9(proc)
                run_step(pg, kind, statements)
                proc = start_router(cfg, tmp_path / "router.log")
                wait_confirmed(pg, slot, pg.one("select pg_current_wal_lsn()::text"))
                continue
            run_step(pg, kind, statements)
            if mode == "kill9" and proc is None:
                proc = start_router(cfg, tmp_path / "router.log")
            if proc is not None:  # the router has taken all of it: live, or the restart point
                wait_confirmed(pg, slot, pg.one("select pg_current_wal_lsn()::text"))
        end = pg.one("select pg_current_wal_lsn()::text")
        if proc is not None:
            wait_confirmed(pg, slot, end)
            kill9(proc) if mode == "kill9" else proc.terminate()
            proc.wait(timeout=30)
            proc = None
        done = run_router(cfg)
        if mode == "after":  # the slot's backlog begins before the first ALTER
            assert 'source="first definitions message (change)"' in done.stdout + done.stderr
        compared, topics = 0, existing_topics(kafka_bootstrap)
        for k in PUBS:
            want = [(tbl, op, old, new if new is None else tuple(
                        (c, pg_text(x)) for c, x in new)) for tbl, op, old, new in
                    oracle(pg, oracle_slots[k], n[k])]
            got = topic_ops(kafka_bootstrap, f"r{k}_{u}", [n[x] for x in ("t", "u", "w", "x",
                                                                          "p", "p1", "p2")], topics)
            assert got == want, (mode, k, [(i, a, b) for i, (a, b) in enumerate(
                zip(got + [None] * len(want), want + [None] * len(got))) if a != b][:6])
            compared += len(want)
        assert compared > 40
        log = (tmp_path / "router.log").read_text() if (tmp_path / "router.log").exists() else ""
        assert PREFIX not in log or "publication definitions changed" in log
    finally:
        if proc is not None:
            kill9(proc)
        for s in [slot, *oracle_slots.values()]:
            pg.drop_slot(s)
        pg.run(" ".join(f"drop publication if exists {n[k]};" for k in PUBS)
               + f"drop publication if exists sp_{u}")
        pg.run(f"drop table if exists {n['t']}, {n['u']}, {n['w']}, {n['x']}, {n['p']}")
        pg.close()


def test_without_the_trigger_changes_are_polled_with_a_warning(pg_dsn, kafka_bootstrap,
                                                               tmp_path):
    """No event trigger and a router that is no superuser (so it cannot install it):
    ``check`` says the route polls, the router notices an ALTER within its poll interval,
    warns that positions are approximate and applies it from then on; ``setup`` refuses
    that role in one line; a superuser's ``check`` says the router would install it, and
    after ``setup`` ``check`` says the route follows the WAL."""
    # a database of its own: removing the trigger here never changes what other tests see
    server = Pg(pg_dsn)
    u = unique("pp")
    server.run(f"create database {u}_db")
    pg_dsn = database_dsn(pg_dsn, f"{u}_db")
    pg = Pg(pg_dsn)
    t, role = f"t_{u}", f"{u}_role"
    pg.run(f"create role {role} login replication")
    role_dsn = pg_dsn.replace("postgres@", f"{role}@", 1)
    assert role_dsn != pg_dsn
    pg.run(f"create table {t} (id int primary key, v int)")
    pg.run(f"alter table {t} replica identity full")
    pg.run(f"create publication pf_{u} for table {t} where (v > 10)")
    pg.run(f"create publication sp_{u} for table {t}")
    pg.run(f"grant select on {t} to {role}")  # a slot the router makes starts with a copy
    cfg, super_cfg = (write_config(
        tmp_path / f"{name}.toml", dsn=dsn, slot=f"{u}_router", publications=[f"sp_{u}"],
        bootstrap=kafka_bootstrap, source_extra="publication_poll_interval = 0.3",
        routes=f'[[routes]]\nname = "r_{u}"\npublication = "pf_{u}"\n')
        for name, dsn in (("router", role_dsn), ("super", pg_dsn)))
    pgrouter = [sys.executable, "-m", "actors.cli"]
    proc = None
    try:  # a superuser's router installs the trigger itself: start without it
        done = subprocess.run([*pgrouter, "setup", "-c", str(super_cfg), "--uninstall"],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        check = subprocess.run([*pgrouter, "check", "-c", str(cfg)], capture_output=True,
                               text=True, timeout=60, cwd=ROOT)
        assert f"mode routes[0] (r_{u}): poll: " in check.stdout, check.stdout
        assert "positions are approximate" in check.stdout
        proc = start_router(cfg, tmp_path / "router.log")
        deadline = time.monotonic() + DEADLINE
        while not pg.run("select 1 from pg_replication_slots where slot_name = %s and active",
                         f"{u}_router"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        pg.run(f"insert into {t} values (1, 50), (2, 5)")
        wait_confirmed(pg, f"{u}_router", pg.one("select pg_current_wal_lsn()::text"))
        pg.run(f"alter publication pf_{u} set table {t} where (v < 10)")
        log = tmp_path / "router.log"
        # the warning, then the reload it announces (applied from the next transaction)
        while "publications reloaded" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        assert "positions are approximate" in log.read_text()
        pg.run(f"insert into {t} values (3, 5), (4, 50)")
        wait_confirmed(pg, f"{u}_router", pg.one("select pg_current_wal_lsn()::text"))
        ids = [r["value"]["after"]["id"] for r in read_topic(kafka_bootstrap,
                                                              f"r_{u}.public.{t}")]
        assert ids == [1, 3]
        kill9(proc)
        proc = None
        pg.run(f"alter publication pf_{u} set table {t} where (v > 100)")  # while stopped
        done = run_router(cfg)
        assert "changed inside the slot's backlog" in done.stdout + done.stderr
        setup = subprocess.run([*pgrouter, "setup", "-c", str(cfg)], capture_output=True,
                               text=True, timeout=60, cwd=ROOT)
        assert setup.returncode == 2 and "needs a superuser" in setup.stderr, setup.stderr
        assert len(setup.stderr.strip().splitlines()) == 1
        check = subprocess.run([*pgrouter, "check", "-c", str(super_cfg)],
                               capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert "wal: " in check.stdout and "installs it at start" in check.stdout, check.stdout
        setup = subprocess.run([*pgrouter, "setup", "-c", str(super_cfg)],
                               capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert setup.returncode == 0, setup.stderr
        check = subprocess.run([*pgrouter, "check", "-c", str(cfg)], capture_output=True,
                               text=True, timeout=60, cwd=ROOT)
        assert f"mode routes[0] (r_{u}): wal: " in check.stdout, check.stdout
        assert "installs it at start" not in check.stdout
    finally:
        if proc is not None:
            kill9(proc)
        subprocess.run([*pgrouter, "setup", "-c", str(super_cfg), "--uninstall"],
                       capture_output=True, timeout=60, cwd=ROOT)
        pg.drop_slot(f"{u}_router")
        pg.run(f"drop publication if exists pf_{u}, sp_{u}")
        pg.run(f"drop table if exists {t}")
        pg.run(f"drop owned by {role}")
        pg.close()
        server.run(f"drop database {u}_db with (force)")
        server.run(f"drop role if exists {role}")
        server.close()
