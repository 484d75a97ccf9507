"""What each PostgreSQL version offers, used by the router on the real servers:

* origin filtering: with the policy "none" the slot's ``origin`` option makes PostgreSQL 16+
  drop replicated transactions itself; on 15 the router drops them. Either way the topic
  holds only local changes (the matrix runs this on 15–18), and the router speaks the
  highest pgoutput protocol the server has (4 from 16, 3 on 15);
* generated columns (18): a route publishes a stored generated column exactly when its
  publication does (``publish_generated_columns = stored`` or a column list naming it), as
  real subscriptions of the same publications show.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.conftest import version_server
from tests.helpers import Pg, fold_rows, pg_text, read_topic, run_router, unique, write_config
from tests.e2e.test_publication_parity import Subscriber

pytestmark = pytest.mark.services


@pytest.mark.pg_matrix
def test_origin_none_drops_replicated_changes_on_the_server_from_16(pg_dsn, pg_version,
                                                                   kafka_bootstrap, tmp_path):
    pg = Pg(pg_dsn)
    t, origin = unique("orig"), unique("node")
    pg.run(f"create table {t} (id int primary key, v text); create publication {t} for table {t}")
    pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", t)
    pg.run("select pg_replication_origin_create(%s)", origin)
    try:
        pg.run(f"insert into {t} values (1, 'local')")
        pg.run("select pg_replication_origin_session_setup(%s)", origin)
        pg.run(f"insert into {t} values (2, 'replicated')")
        pg.run("select pg_replication_origin_session_reset()")
        pg.run(f"insert into {t} values (3, 'local')")
        cfg = tmp_path / "r.toml"
        cfg.write_text(f"""origin = "none"
[source]
dsn = {json.dumps(pg_dsn)}
slot = "{t}"
publications = ["{t}"]
[kafka]
bootstrap_servers = "{kafka_bootstrap}"
[[routes]]
name = "r"
tables = ["public.{t}"]
topic = "{t}"
""")
        proc = run_router(cfg, timeout=60)
        where = "server" if pg_version >= 16 else "client"
        assert re.search(rf"origin_filter\W+{where}", proc.stderr), proc.stderr[-2000:]
        # the highest pgoutput protocol the server speaks (4: streaming = parallel, 16+)
        proto = 4 if pg_version >= 16 else 3
        assert re.search(rf"proto_version\W+{proto}\b", proc.stderr), proc.stderr[-2000:]
        recs = read_topic(kafka_bootstrap, t)
        assert sorted(r["value"]["after"]["id"] for r in recs) == [1, 3]
    finally:
        pg.drop_slot(t)
        pg.run("select pg_replication_origin_drop(%s)", origin)
        pg.run(f"drop publication {t}; drop table {t}")
        pg.close()


@pytest.fixture(scope="session")
def pg18(request) -> str:
    return version_server(request, 18)


@pytest.mark.parametrize("changes", ["wal", "poll"])  # where publication definitions come from
def test_generated_columns_are_published_as_postgresql_18_does(pg18, kafka_bootstrap, tmp_path,
                                                               changes):
    pg = Pg(pg18)
    u = unique("gen")
    t = f"t_{u}"
    pg.run(f"create table {t} (id int primary key, a int, "
           f"twice int generated always as (a * 2) stored)")
    pg.run(f"create publication sp_{u} for table {t} with (publish_generated_columns = stored);"
           f"create publication stored_{u} for table {t} with (publish_generated_columns = stored);"
           f"create publication plain_{u} for table {t};"
           f"create publication listed_{u} for table {t} (id, twice)")
    subscriber_ddl = f"create table {t} (id int primary key, a int, twice int)"
    subs = {name: Subscriber(pg, f"s{name}_{u}", [f"{name}_{u}"], subscriber_ddl)
            for name in ("stored", "plain", "listed")}
    slot = f"slot_{u}"
    pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", slot)
    try:
        pg.run(f"insert into {t} (id, a) values (1, 10), (2, 20)")
        pg.run(f"update {t} set a = 21 where id = 2")
        pg.run(f"delete from {t} where id = 1")
        pg.run(f"insert into {t} (id, a) values (3, 30)")
        lsn = pg.one("select pg_current_wal_lsn()::text")
        for s in subs.values():
            s.wait_caught_up(lsn)
        routes = "".join(f'\n[[routes]]\nname = "{n}_{u}"\npublications = ["{n}_{u}"]\n'
                         for n in subs)
        cfg = write_config(tmp_path / "r.toml", dsn=pg18, slot=slot, publications=[f"sp_{u}"],
                           bootstrap=kafka_bootstrap, routes=routes,
                           source_extra=f'publication_changes = "{changes}"')
        try:
            run_router(cfg, timeout=60)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"router did not catch up:\n{exc.stderr.decode()[-4000:]}")
        cols = ["id", "a", "twice"]
        published = {"stored": {"id", "a", "twice"}, "plain": {"id", "a"},
                     "listed": {"id", "twice"}}
        for name, sub in subs.items():
            recs = read_topic(kafka_bootstrap, f"{name}_{u}.public.{t}")
            assert recs, name
            for r in recs:
                row = r["value"]["after"] or r["value"]["before"]
                assert set(row) <= published[name], (name, row)
            folded = fold_rows(recs, ["id"])
            got = {tuple(pg_text(row.get(c)) for c in cols) for row in folded.values()}
            assert got == sub.rows(t, cols), name
        assert subs["stored"].rows(t, cols) == {("2", "21", "42"), ("3", "30", "60")}
    finally:
        for s in subs.values():
            s.drop()
        pg.drop_slot(slot)
        pg.run(" ".join(f"drop publication if exists {p}_{u};"
                        for p in ("sp", "stored", "plain", "listed")))
        pg.run(f"drop table if exists {t}")
        pg.close()
