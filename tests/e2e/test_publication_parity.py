"""Publication routes vs PostgreSQL's own logical replication, on the real stack.

The worked examples of the row-filter docs (seed 004: t1/t2/t3 with p1, p2, p3; the
partitioned table with ``publish_via_partition_root`` true and false) plus a column list, unchanged TOAST
and two publications whose filters are OR-ed per action, run once through
real subscriptions (one subscriber database each) and once through one pgrouter slot with one
route per subscription. Folded by key in position order, every topic must hold exactly the
rows the subscriber holds, and the seed's documented rows.
"""

from __future__ import annotations

import subprocess
import time

import psycopg2
import pytest
from psycopg2.extensions import parse_dsn

from tests.e2e.guarantee import delete_topics
from tests.e2e.pgoutput_oracle import server_ops, topic_ops
from tests.helpers import (Pg, database_dsn, read_topic, run_router, table_rows, topic_rows,
                           unique, write_config)

pytestmark = pytest.mark.services

DEADLINE = 90



class Subscriber:
    """A subscriber database with one subscription over a slot created beforehand."""

    def __init__(self, pg: Pg, tag: str, publications: list[str], ddl: str):
        self.pg, self.db, self.slot = pg, f"{tag}_db", f"{tag}_slot"
        pg.run(f"create database {self.db}")
        pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", self.slot)
        self.conn = psycopg2.connect(pg.dsn, dbname=self.db)
        self.conn.autocommit = True
        d = parse_dsn(pg.dsn)
        conninfo = " ".join(f"{k}={d[k]}" for k in ("host", "port", "user", "dbname") if k in d)
        with self.conn.cursor() as cur:
            cur.execute(ddl)
            cur.execute(f"create subscription {tag} connection '{conninfo}' publication "
                        f"{', '.join(publications)} with (create_slot = false, slot_name = "
                        f"'{self.slot}', copy_data = false)")
        self.tag = tag

    def wait_caught_up(self, lsn: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            done = self.pg.one("select confirmed_flush_lsn >= %s::pg_lsn from "
                               "pg_replication_slots where slot_name = %s", lsn, self.slot)
            if done:
                return
            time.sleep(0.2)
        raise AssertionError(f"subscription {self.tag} did not catch up to {lsn}")

    def rows(self, table: str, columns: list[str]) -> set:
        return table_rows(self.conn, table, columns)

    def drop(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute(f"alter subscription {self.tag} disable")
            cur.execute(f"alter subscription {self.tag} set (slot_name = none)")
            cur.execute(f"drop subscription {self.tag}")
        self.conn.close()
        self.pg.drop_slot(self.slot)
        self.pg.run(f"drop database {self.db} with (force)")


@pytest.mark.pg_matrix
def test_seed_examples_and_column_lists_match_subscriptions(pg_dsn, kafka_bootstrap, tmp_path):
    from actors.services.publication_trigger import install_sql

    # a database of its own, with the event trigger and TRUNCATE markers of `pgrouter setup`
    # in place before its tables exist (as a user runs setup first); other tests never see
    # them, and what this test sees never depends on what ran before
    server = Pg(pg_dsn)
    u = unique("pp")
    server.run(f"create database {u}_src")
    src_dsn = database_dsn(pg_dsn, f"{u}_src")
    pg = Pg(src_dsn)
    pg.run(";\n".join(install_sql()))
    t1, t2, t3, t4, parent, child = (f"{n}_{u}" for n in ("t1", "t2", "t3", "t4", "parent",
                                                          "child"))
    tables_ddl = f"""
        create table {t1}(a int, b int, c text, primary key(a, c));
        create table {t2}(d int, e int, f int, primary key(d));
        create table {t3}(g int, h int, i int, primary key(g));
        create table {t4}(id int primary key, b text, c int, d text);
        create table {parent}(a int primary key) partition by range(a);
        create table {child} partition of {parent} default;
    """
    pg.run(tables_ddl)
    pg.run(f"alter table {t4} alter column b set storage external")
    pg.run(f"""
        create publication p1_{u} for table {t1} where (a > 5 and c = 'NSW');
        create publication p2_{u} for table {t1}, {t2} where (e = 99);
        create publication p3_{u} for table {t2} where (d = 10), {t3} where (g = 10);
        create publication p4r_{u} for table {parent} where (a < 5), {child} where (a >= 5)
            with (publish_via_partition_root = true);
        create publication p4l_{u} for table {parent}, {child} where (a >= 5)
            with (publish_via_partition_root = false);
        create publication p5_{u} for table {t4} (id, b, c) where (id > 10);
        create publication p6_{u} for table {t4} (id, b, c) where (c < 50)
            with (publish = 'insert');
        create publication sp_{u} for table {t1}, {t2}, {t3}, {t4}, {parent};
    """)
    subs = []
    slot = f"{u}_router"
    try:
        subs = [Subscriber(pg, f"{u}_a", [f"p1_{u}", f"p5_{u}", f"p6_{u}"], tables_ddl),
                Subscriber(pg, f"{u}_b", [f"p2_{u}", f"p3_{u}"], tables_ddl),
                Subscriber(pg, f"{u}_c", [f"p4r_{u}"], tables_ddl),
                Subscriber(pg, f"{u}_d", [f"p4l_{u}"], tables_ddl)]
        pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", slot)
        route_pubs = {"a": ["p1", "p5", "p6"], "b": ["p2", "p3"], "c": ["p4r"], "d": ["p4l"]}
        for route in route_pubs:  # PostgreSQL's own sequence per route, read after the run
            pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')",
                   f"{slot}_{route}_oracle")

        # seed 004, 31.3.7, in the documented order
        for a, b, c in [(2, 102, "NSW"), (3, 103, "QLD"), (4, 104, "VIC"), (5, 105, "ACT"),
                        (6, 106, "NSW"), (7, 107, "NT"), (8, 108, "QLD"), (9, 109, "NSW")]:
            pg.run(f"insert into {t1} values (%s, %s, %s)", a, b, c)
        pg.run(f"update {t1} set b = 999 where a = 6")
        pg.run(f"update {t1} set a = 555 where a = 2")
        pg.run(f"update {t1} set c = 'VIC' where a = 9")
        pg.run(f"insert into {t2} values (1, 99, 1), (10, 1, 1), (11, 2, 2), (12, 99, 3)")
        pg.run(f"insert into {t3} values (10, 1, 1), (11, 2, 2), (12, 3, 3)")
        pg.run(f"update {t3} set h = 100 where g = 10")     # match/match: update
        pg.run(f"update {t3} set g = 13 where g = 10")      # match/no: delete
        pg.run(f"update {t3} set g = 10 where g = 12")      # no/match: insert
        pg.run(f"delete from {t3} where g = 11")
        pg.run(f"insert into {parent} values (2), (4), (6)")
        pg.run(f"insert into {child} values (3), (5), (7)")
        pg.run(f"truncate {parent}")
        pg.run(f"insert into {parent} values (2), (4), (6)")
        pg.run(f"insert into {child} values (3), (5), (7)")
        big = "x" * 5000
        pg.run(f"insert into {t4} select g, case when g >= 12 then %s else '' end || g, g * 10,"
               f" 'd' from generate_series(1, 14) g", big)
        # UPDATE/DELETE filters come from p5 only (p6 publishes INSERT): id > 10
        pg.run(f"update {t4} set id = 20 where id = 9")     # no -> yes: insert
        pg.run(f"update {t4} set id = 7 - 100 where id = 11")  # yes -> no: delete
        pg.run(f"update {t4} set c = 70 where id = 12")     # yes/yes: update, b unchanged TOAST
        pg.run(f"update {t4} set d = 'e' where id = 3")     # no/no (key unchanged: new row)
        pg.run(f"update {t4} set c = 1 where id = 14")      # key unchanged, new row matches
        pg.run(f"delete from {t4} where id in (1, 13)")     # 1: filtered out, 13: published
        lsn = pg.one("select pg_current_wal_lsn()::text")
        for s in subs:
            s.wait_caught_up(lsn)

        routes = "".join(f"""
[[routes]]
name = "{name}_{u}"
publications = [{', '.join(f'"{p}_{u}"' for p in pubs)}]
""" for name, pubs in [("a", ["p1", "p5", "p6"]), ("b", ["p2", "p3"]), ("c", ["p4r"]),
                       ("d", ["p4l"])])
        cfg = write_config(tmp_path / "router.toml", dsn=src_dsn, slot=slot,
                           publications=[f"sp_{u}"], bootstrap=kafka_bootstrap, routes=routes)
        try:
            run_router(cfg, timeout=60)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"router did not catch up:\n{exc.stderr.decode()[-5000:]}")

        def topic(route, table):
            return f"{route}_{u}.public.{table}"

        cases = [  # subscriber, route, table, key, columns
            (subs[0], "a", t1, ["a", "c"], ["a", "b", "c"]),
            (subs[0], "a", t4, ["id"], ["id", "b", "c"]),
            (subs[1], "b", t1, ["a", "c"], ["a", "b", "c"]),
            (subs[1], "b", t2, ["d"], ["d", "e", "f"]),
            (subs[1], "b", t3, ["g"], ["g", "h", "i"]),
            (subs[2], "c", parent, ["a"], ["a"]),
            (subs[3], "d", child, ["a"], ["a"]),
        ]
        for sub, route, table, key, columns in cases:
            expected = sub.rows(table, columns)
            got = topic_rows(kafka_bootstrap, topic(route, table), key, columns)
            assert got == expected, (route, table, sorted(expected ^ got))
        # the rows the documentation says the subscribers hold
        assert subs[0].rows(t1, ["a", "b", "c"]) == {("6", "999", "NSW"), ("555", "102", "NSW")}
        assert subs[2].rows(parent, ["a"]) == {("2",), ("3",), ("4",)}
        assert subs[3].rows(child, ["a"]) == {("5",), ("6",), ("7",)}
        # column list: the unpublished column never leaves PostgreSQL
        recs = read_topic(kafka_bootstrap, topic("a", t4))
        assert recs and all("d" not in (r["value"]["after"] or r["value"]["before"])
                            for r in recs)
        # via root, the partition has no topic of its own; without, the root has none
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        try:
            existing = set(admin.list_topics())
        finally:
            admin.close()
        # every topic any route could write (each route × each published table) holds the
        # operations PostgreSQL sends that route's subscriber, key by key, in order; the
        # topics of tables a route does not publish stay empty
        keys = {t1: ["a", "c"], t2: ["d"], t3: ["g"], t4: ["id"], parent: ["a"], child: ["a"]}
        for route, pubs in route_pubs.items():
            expected = server_ops(pg, f"{slot}_{route}_oracle", [f"{p}_{u}" for p in pubs])
            for table, key in keys.items():
                name = topic(route, table)
                records = read_topic(kafka_bootstrap, name) if name in existing else []
                assert topic_ops(records, key) == expected.get(table, []), (route, table)
        assert topic("c", parent) in existing and topic("c", child) not in existing
        assert topic("d", child) in existing and topic("d", parent) not in existing
        assert topic("b", t4) not in existing
    finally:
        for s in subs:
            s.drop()
        pg.drop_slot(slot)
        for route in ("a", "b", "c", "d"):
            pg.drop_slot(f"{slot}_{route}_oracle")
        delete_topics(kafka_bootstrap, [f"{r}_{u}.public.{t}" for r in "abcd"
                                        for t in (t1, t2, t3, t4, parent, child)])
        pg.run(" ".join(f"drop publication if exists {p}_{u};"
                        for p in ("p1", "p2", "p3", "p4r", "p4l", "p5", "p6", "sp")))
        pg.close()
        server.run(f"drop database {u}_src with (force)")
        server.close()
