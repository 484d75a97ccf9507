"""TRUNCATE of partition trees under ``publish_via_partition_root``, route by route, against
what PostgreSQL sends a subscriber of the route's publications (a pgoutput slot peeked with
them) and against a native subscription's rows.

The slot streams a publication that sends partitions (so the stream names only leaves); the
routes follow publications that publish via the root. PostgreSQL sends a root's TRUNCATE only
when the statement truncated the root itself and the root's own publications publish
TRUNCATE; a partition's TRUNCATE alone sends nothing. The cases come from the independent
checks of issue 31 (derived from ``013_partition.pl``). The test runs in a database of its
own: ``pgrouter setup`` (event trigger and TRUNCATE markers) never reaches other tests.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.pgoutput_oracle import server_ops, topic_ops
from tests.e2e.test_publication_parity import Subscriber
from tests.helpers import Pg, database_dsn, read_topic, run_router, topic_rows, unique, write_config
from tests.conftest import ROOT

pytestmark = pytest.mark.services

TABLES = """
    create table r (a int primary key) partition by list (a);
    create table r_1 partition of r for values in (1, 2);
    create table m (a int primary key) partition by list (a);
    create table m_1 partition of m for values in (1, 2, 3, 4) partition by list (a);
    create table m_1_1 partition of m_1 for values in (1, 2, 3, 4);
    create table x (a int primary key) partition by list (a);
    create table x_1 partition of x for values in (1, 2);
    create table e (a int primary key) partition by list (a);
    create table e_1 partition of e for values in (1, 2) partition by list (a);
"""

# (route, publications): p publishes everything via the root; pxm is px (x without
# TRUNCATE) with pxm (x_1), both via the root
ROUTES = {"p": ["p"], "pxm": ["px", "pxm"]}


@pytest.mark.parametrize("changes", ["wal", "poll"])
def test_partition_truncates_match_what_postgresql_sends(pg_dsn, kafka_bootstrap, tmp_path,
                                                         changes):
    admin = Pg(pg_dsn)
    u = unique("ptr")
    db = f"{u}_db"
    admin.run(f"create database {db}")
    dsn = database_dsn(pg_dsn, db)
    pg = Pg(dsn)
    subscriber = None
    slot = f"{u}_slot"
    try:
        pg.run(TABLES)
        pg.run("create publication slotpub for all tables")
        pg.run("create publication p for all tables with (publish_via_partition_root = true)")
        pg.run("create publication px for table x with (publish = 'insert, update, delete', "
               "publish_via_partition_root = true)")
        pg.run("create publication pxm for table x_1 with (publish_via_partition_root = true)")
        routes = "".join(f'[[routes]]\nname = "{u}_{r}"\npublications = {pubs!r}\n'
                         f'topic = "{u}.{r}.{{table}}"\n'.replace("'", '"')
                         for r, pubs in ROUTES.items())
        cfg = write_config(tmp_path / "r.toml", dsn=dsn, slot=slot, publications=["slotpub"],
                           bootstrap=kafka_bootstrap, routes=routes,
                           source_extra=f'publication_changes = "{changes}"\n',
                           extra='[snapshot]\nmode = "never"\n')
        setup = subprocess.run([sys.executable, "-m", "actors.cli", "setup", "-c", str(cfg)],
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert setup.returncode == 0, setup.stderr
        assert pg.one("select count(*) from pg_trigger where tgname = 'pgrouter_truncate'") == 6
        run_router(cfg)  # the slot exists from here on
        for r in ROUTES:  # PostgreSQL's own output for each route's publications
            pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", f"{u}_{r}_o")
        # a native subscription of p (its own database, reading the source database)
        subscriber = Subscriber(pg, f"{u}_s", ["p"], TABLES) if changes == "wal" else None

        pg.run("insert into r values (1)")
        pg.run("truncate r_1")                # only partition of r: nothing for r
        pg.run("insert into m values (1), (2)")
        pg.run("truncate m_1")                # a middle level: nothing for m
        pg.run("insert into x values (1)")
        pg.run("truncate x")                  # x itself: p sends it, px/pxm do not
        pg.run("truncate e")                  # a root without leaves: p sends it
        pg.run("insert into m values (3)")
        pg.run("truncate m; insert into m values (4)")  # the root, a row after it, one txn
        end = pg.one("select pg_current_wal_lsn()::text")
        run_router(cfg)

        for r, pubs in ROUTES.items():
            expected = server_ops(pg, f"{u}_{r}_o", pubs)
            for table in ("r", "m", "x", "e"):
                records = read_topic(kafka_bootstrap, f"{u}.{r}.{table}",  # router exited
                                     missing_ok=not expected.get(table), settle=0)
                got = topic_ops(records, ["a"])
                assert got == expected.get(table, []), (r, table, got, expected.get(table))
        # the expectations, spelled out
        ops = {t: [op for op, _ in topic_ops(read_topic(kafka_bootstrap, f"{u}.p.{t}"), ["a"])]
               for t in ("r", "m", "x", "e")}
        assert ops == {"r": ["c"], "m": ["c", "c", "c", "t", "c"], "x": ["c", "t"],
                       "e": ["t"]}, ops
        assert "t" not in [op for op, _ in topic_ops(read_topic(kafka_bootstrap,
                                                                f"{u}.pxm.x"), ["a"])]
        assert read_topic(kafka_bootstrap, f"{u}.pxm.r", missing_ok=True, settle=0) == []
        if subscriber:
            subscriber.wait_caught_up(end)
            for table in ("r", "m"):
                assert topic_rows(kafka_bootstrap, f"{u}.p.{table}", ["a"], ["a"]) == \
                    subscriber.rows(table, ["a"])
            assert subscriber.rows("r", ["a"]) == {("1",)}  # row 1 kept, as PostgreSQL does
            assert subscriber.rows("m", ["a"]) == {("4",)}
    finally:
        if subscriber:
            subscriber.drop()
        for s in [slot] + [f"{u}_{r}_o" for r in ROUTES]:
            pg.drop_slot(s)
        pg.close()
        admin.run(f"drop database {db} with (force)")
        admin.close()
