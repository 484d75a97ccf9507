"""DDL that gives a table a new file (TRUNCATE, ALTER TABLE … TYPE, ADD COLUMN with a
volatile default, VACUUM FULL, CLUSTER) while a snapshot runs, on the real stack.

Such a command is not MVCC-safe: a snapshot older than it sees the new file's rows as not
yet committed, so a read finds the table empty. The initial snapshot must not record such a
table done with its rows missing; a backfill chunk must not read it as empty. Each topic,
folded by a plain consumer (``read_topic``: confluent-kafka), equals ``SELECT`` at the end.
"""

from __future__ import annotations

import time

import psycopg2
import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.test_backfill import progress, snapshot_cmd
from tests.e2e.test_snapshot import _initial_done
from tests.e2e.test_snapshot_ranges import _SlowSource, _caught_up, _wait
from tests.helpers import (Pg, kill9, start_router, table_rows, topic_rows, unique,
                           write_config)

pytestmark = pytest.mark.services

DEADLINE = 120
COLS = ["id", "n", "v"]
#: bytes/s the router reads from PostgreSQL in the initial snapshot test: the first table
#: (~1.3 MB of COPY text) takes about 3 s, time enough for the DDL on the others
SLOW_LINK = 400_000

#: DDL run on a table the initial snapshot has not read yet (``{t}``: the table)
DDL = {
    "alter_type": ["alter table {t} alter column n type bigint"],
    "add_volatile_column": ["alter table {t} add column x int default (random() * 1000)::int"],
    "truncate": ["truncate {t}",
                 "insert into {t} select g, g, 'after' from generate_series(1, 50) g"],
    "vacuum_full": ["vacuum full {t}"],
    "cluster": ["cluster {t} using {t}_pkey"],
}


def _start_for_backfills(tmp_path, dsn, bootstrap, slot, publication, routes, snapshot):
    """A router that makes no initial snapshot (``snapshot``: more ``[snapshot]`` keys), for
    ``pgrouter snapshot`` requests: (config, log, process, deadline)."""
    cfg = write_config(tmp_path / "router.toml", dsn=dsn, slot=slot, publications=[publication],
                       bootstrap=bootstrap, routes=routes,
                       extra='[snapshot]\nmode = "never"\n' + snapshot)
    log = tmp_path / "router.log"
    return cfg, log, start_router(cfg, log), time.monotonic() + DEADLINE


def _slot_active(pg, slot, proc, log, deadline):
    """The router streams: its slot is made. A slot is active already while
    CREATE_REPLICATION_SLOT waits for the server's running transactions; a test that then
    opens a transaction holding a lock (and an xid) would have the creation wait for it, and
    itself wait for the router for ever (seen late in a loaded full run: an empty log)."""
    _wait("the slot", lambda: pg.run("select 1 from pg_replication_slots where "
                                     "slot_name = %s and active", slot)
          and "streaming started" in log.read_text(errors="replace"), proc, log, deadline)


def _columns(pg, table):
    return [r[0] for r in pg.run("select attname::text from pg_attribute where attrelid = "
                                 "%s::regclass and attnum > 0 and not attisdropped "
                                 "order by attnum", table)]


def _stop(proc):
    if proc.poll() is None:
        kill9(proc)


def test_ddl_on_tables_the_initial_snapshot_has_not_read(pg_dsn, kafka_bootstrap, tmp_path):
    """One session copies the first table slowly; meanwhile each other table gets one of
    the commands and then some changes. Every table's topic folds to the table."""
    pg = Pg(pg_dsn)
    u = unique("snapddl")
    first = f"{u}_a"
    tables = {kind: f"{u}_b_{kind}" for kind in DDL}
    pg.run(f"create table {first} (id int primary key, v text)")
    pg.run(f"insert into {first} select g, repeat('x', 60) from generate_series(1, 20000) g")
    for kind, t in tables.items():
        pg.run(f"create table {t} (id int primary key, n int, v text)")
        pg.run(f"insert into {t} select g, g, 'v' || g from generate_series(1, 2000) g")
        if kind in ("vacuum_full", "cluster"):  # gaps: the command moves rows
            pg.run(f"delete from {t} where id % 3 = 0")
    pg.run(f"create publication {u} for table {first}, {', '.join(tables.values())}")
    slot, route = f"{u}_slot", f"r_{u}"
    topics = [f"{route}.public.{t}" for t in (first, *tables.values())]
    source = _SlowSource(pg_dsn)
    cfg = write_config(tmp_path / "router.toml", dsn=source.dsn, slot=slot, publications=[u],
                       bootstrap=kafka_bootstrap,
                       routes=f'[[routes]]\nname = "{route}"\n'
                              f'tables = {[f"public.{t}" for t in (first, *tables.values())]}\n'
                              .replace("'", '"'),
                       extra="[snapshot]\nparallel = 1\nchunk_rows = 500\n")
    log = tmp_path / "router.log"
    proc = start_router(cfg, log)
    deadline = time.monotonic() + DEADLINE
    copying_first = ("select count(*) > 0 from pg_stat_activity where application_name = "
                     "'pgrouter-snapshot' and query like 'COPY%%' and query like %s",
                     f"%{first}%")
    try:
        _wait("the copy of the first table", lambda: pg.one(*copying_first), proc, log,
              deadline)
        for kind, t in tables.items():
            for sql in DDL[kind]:
                pg.run(sql.format(t=t))
            pg.run(f"update {t} set v = 'changed' where id between 1 and 5")
            pg.run(f"insert into {t} (id, n, v) values (9000, 9000, 'late')")
        # the commands ran while the snapshot was still on the first table
        assert pg.one(*copying_first), log.read_text()[-3000:]
        _wait("the initial snapshot", lambda: _initial_done(kafka_bootstrap, slot), proc, log,
              deadline)
        _caught_up(pg, slot, proc, log, deadline)
        _stop(proc)
        text = log.read_text()
        wrong = {}
        for kind, t in {"first": first, **tables}.items():
            cols = _columns(pg, t)
            got = topic_rows(kafka_bootstrap, f"{route}.public.{t}", ["id"], cols)
            want = table_rows(pg.conn, t, cols)
            if got != want:
                wrong[kind] = (f"{len(got)} rows in the topic, {len(want)} in the table; "
                               f"e.g. {sorted(want ^ got)[:3]}")
        assert not wrong, f"{wrong}\n{text[-3000:]}"
        assert "rewritten or truncated after the snapshot" in text
    finally:
        _stop(proc)
        source.close()
        pg.drop_slot(slot)
        pg.run(f"drop publication if exists {u}")
        for t in (first, *tables.values()):
            pg.run(f"drop table if exists {t}")
        delete_topics(kafka_bootstrap, topics)
        pg.close()


BACKFILL_DDL = {
    "alter_type": ["alter table {t} alter column n type bigint"],
    "alter_text": ["alter table {t} alter column n type text using 'n' || n"],
    "truncate": ["truncate {t}",
                 "insert into {t} select g, -g, 'after' from generate_series(1, 30) g"],
}


@pytest.mark.parametrize("kind", sorted(BACKFILL_DDL))
def test_ddl_while_a_backfill_chunk_waits_for_the_table(pg_dsn, kafka_bootstrap, tmp_path,
                                                        kind):
    """The command holds the table when the backfill's chunk comes to read it, and commits
    while the chunk waits: the chunk reads the table as the command left it, not as an
    empty table."""
    pg = Pg(pg_dsn)
    u = unique("bfddl")
    t, slot, route = f"t_{u}", f"{u}_slot", f"r_{u}"
    topic = f"{route}.public.{t}"
    pg.run(f"create table {t} (id int primary key, n int, v text)")
    pg.run(f"insert into {t} select g, g, 'v' || g from generate_series(1, 2000) g")
    pg.run(f"create publication {u} for table {t}")
    cfg, log, proc, deadline = _start_for_backfills(
        tmp_path, pg_dsn, kafka_bootstrap, slot, u,
        f'[[routes]]\nname = "{route}"\ntables = ["public.{t}"]\n', "chunk_rows = 500\n")
    ddl = psycopg2.connect(pg_dsn)
    try:
        _slot_active(pg, slot, proc, log, deadline)
        with ddl.cursor() as cur:  # a transaction: the command holds the table until COMMIT
            for sql in BACKFILL_DDL[kind]:
                cur.execute(sql.format(t=t))
            pid = ddl.get_backend_pid()
        asked = snapshot_cmd(cfg, route, f"public.{t}")
        assert asked.returncode == 0, asked.stderr
        _wait("the chunk to wait for the table", lambda: pg.one(
            "select count(*) > 0 from pg_locks l join pg_stat_activity a using (pid) where "
            "not l.granted and l.relation = %s::regclass and a.pid <> %s", t, pid),
              proc, log, deadline)
        ddl.commit()
        pg.run(f"update {t} set v = 'changed' where id between 1 and 5")
        _wait("the backfill", lambda: any(p["state"] == "done" and p["table"] == f"public.{t}"
                                          for p in progress(kafka_bootstrap, slot)),
              proc, log, deadline)
        _caught_up(pg, slot, proc, log, deadline)
        _stop(proc)
        got = topic_rows(kafka_bootstrap, topic, ["id"], COLS)
        want = table_rows(pg.conn, t, COLS)
        assert got == want, (f"{len(got)} rows in the topic, {len(want)} in the table; "
                             f"e.g. {sorted(want ^ got)[:5]}\n{log.read_text()[-3000:]}")
    finally:
        _stop(proc)
        ddl.close()
        pg.drop_slot(slot)
        pg.run(f"drop publication if exists {u}")
        pg.run(f"drop table if exists {t}")
        delete_topics(kafka_bootstrap, [topic])
        pg.close()
