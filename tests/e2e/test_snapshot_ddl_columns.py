"""DDL that changes a table's columns without rewriting it (ADD COLUMN, DROP COLUMN, RENAME,
a wider varchar, SET NOT NULL), and the other hostile cases of a table changed under a
snapshot (dropped, renamed, rewritten while the router is killed), on the real stack.

The exported snapshot sees a table's rows as of the consistent point, but a read names its
columns as the table has them now: a column added since must be in the records (the stream
after the command has it), a dropped or renamed one must not fail the read. Each topic,
folded by a plain consumer in offset order (confluent-kafka), equals ``SELECT`` at the end.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.test_snapshot import _initial_done
from tests.e2e.test_snapshot_ddl import (_caught_up, _columns, _slot_active, _start_for_backfills,
                                         _stop, _wait)
from tests.e2e.test_snapshot_ranges import _SlowSource
from tests.helpers import (Pg, kill9, pg_text, read_topic, start_router, table_rows, unique,
                           write_config)

pytestmark = pytest.mark.services

DEADLINE = 120
COLS = ["id", "n", "v"]

#: DDL that changes no table file, run on a table the initial snapshot has not read yet
COLUMN_DDL = {
    "add_nullable": ["alter table {t} add column x int"],
    "add_default": ["alter table {t} add column x int default 5"],
    "drop_column": ["alter table {t} drop column n"],
    "rename_column": ["alter table {t} rename column n to n2"],
    "widen_varchar": ["alter table {t} alter column v type varchar(20)"],
    "set_not_null": ["alter table {t} alter column n set default 0",
                     "alter table {t} alter column n set not null"],
    "new_index": ["create index on {t} (v)"],
}


def folded(bootstrap: str, topic: str, columns: list[str]) -> set:
    """What a plain consumer holds after reading ``topic`` in offset order: the last value
    of each key (a tombstone or a delete removes it, a truncate empties it), as
    PostgreSQL's text of ``columns``."""
    rows: dict = {}
    for r in read_topic(bootstrap, topic):  # by partition, then offset
        v = r["value"]
        key = r["raw"][0]
        if v is None or v["op"] == "d":
            rows.pop(key, None)
        elif v["op"] == "t":
            rows = {k: row for k, row in rows.items() if k[0] != r["partition"]}
        else:
            rows[key] = v["after"]
    return {tuple(pg_text(row.get(c)) for c in columns) for row in rows.values()}


class _Snapshot:
    """A slow first table (the initial snapshot reads it for ~3 s through a rate-limited
    link) and the tables of ``kinds``, in one publication and one route."""

    def __init__(self, pg_dsn, bootstrap, tmp_path, prefix: str, kinds, *, rows=2000,
                 extra: str = "[snapshot]\nparallel = 1\nchunk_rows = 500\n"):
        self.pg = pg = Pg(pg_dsn)
        self.bootstrap = bootstrap
        u = self.u = unique(prefix)
        self.first = f"{u}_a"
        self.tables = {kind: f"{u}_b_{kind}" for kind in kinds}
        pg.run(f"create table {self.first} (id int primary key, v text)")
        pg.run(f"insert into {self.first} select g, repeat('x', 60) "
               "from generate_series(1, 20000) g")
        for t in self.tables.values():
            pg.run(f"create table {t} (id int primary key, n int, v varchar(10))")
            pg.run(f"insert into {t} select g, g, 'v' || g from generate_series(1, {rows}) g")
        names = (self.first, *self.tables.values())
        pg.run(f"create publication {u} for table {', '.join(names)}")
        self.slot, self.route = f"{u}_slot", f"r_{u}"
        self.source = _SlowSource(pg_dsn)
        self.cfg = write_config(
            tmp_path / "router.toml", dsn=self.source.dsn, slot=self.slot, publications=[u],
            bootstrap=bootstrap,
            routes=f'[[routes]]\nname = "{self.route}"\npublications = ["{u}"]\n',
            extra=extra)
        self.log = tmp_path / "router.log"
        self.proc = None
        self.deadline = time.monotonic() + DEADLINE

    def topic(self, table: str) -> str:
        return f"{self.route}.public.{table}"

    def start(self):
        self.proc = start_router(self.cfg, self.log)
        return self.proc

    def copying_first(self) -> bool:
        return self.pg.one("select count(*) > 0 from pg_stat_activity where application_name "
                           "= 'pgrouter-snapshot' and query like 'COPY%%' and query like %s",
                           f"%{self.first}%")

    def wait(self, what, check):
        return _wait(what, check, self.proc, self.log, self.deadline)

    def finish(self):
        """The snapshot done and the stream caught up, then the router stopped."""
        self.wait("the initial snapshot", lambda: _initial_done(self.bootstrap, self.slot))
        _caught_up(self.pg, self.slot, self.proc, self.log, self.deadline)
        _stop(self.proc)

    def wrong(self, tables: dict) -> dict:
        """The tables whose topic, folded, is not the table: what differs."""
        out = {}
        for kind, t in tables.items():
            cols = _columns(self.pg, t)
            got = folded(self.bootstrap, self.topic(t), cols)
            want = table_rows(self.pg.conn, t, cols)
            if got != want:
                out[kind] = (f"{len(got)} rows in the topic, {len(want)} in the table; "
                             f"e.g. {sorted(want ^ got, key=str)[:3]}")
        return out

    def close(self, extra_tables=()):
        if self.proc is not None:
            _stop(self.proc)
        self.source.close()
        pg = self.pg
        pg.drop_slot(self.slot)
        pg.run(f"drop publication if exists {self.u}")
        names = (self.first, *self.tables.values(), *extra_tables)
        for t in names:
            pg.run(f"drop table if exists {t}")
        delete_topics(self.bootstrap, [self.topic(t) for t in names])
        pg.close()


def test_column_ddl_on_tables_the_initial_snapshot_has_not_read(pg_dsn, kafka_bootstrap,
                                                                tmp_path):
    """While the first table is copied, each other table gets a column DDL that keeps its
    file, then an update and an insert. No read fails, and every topic folds to the table
    with the columns it has now."""
    s = _Snapshot(pg_dsn, kafka_bootstrap, tmp_path, "snapcol", COLUMN_DDL)
    try:
        s.start()
        s.wait("the copy of the first table", s.copying_first)
        for kind, t in s.tables.items():
            for sql in COLUMN_DDL[kind]:
                s.pg.run(sql.format(t=t))
            s.pg.run(f"update {t} set v = 'changed' where id between 1 and 5")
            s.pg.run(f"insert into {t} (id, v) values (9000, 'late')")
        assert s.copying_first(), s.log.read_text()[-3000:]
        s.finish()
        wrong = s.wrong({"first": s.first, **s.tables})
        assert not wrong, f"{wrong}\n{s.log.read_text()[-3000:]}"
        text = s.log.read_text()
        assert "Traceback" not in text and "restarting" not in text, text[-3000:]
        assert "altered (its columns changed) after the snapshot" in text
    finally:
        s.close()


def test_a_rewrite_without_logical_messages_stops_with_one_line(pg_dsn, kafka_bootstrap,
                                                               tmp_path):
    """``[source] messages = false``: a table truncated before the snapshot reads it cannot
    be copied by backfill. The router stops with one line naming ``source.messages`` (no
    traceback), does not record the snapshot done, and confirms nothing past the
    consistent point."""
    s = _Snapshot(pg_dsn, kafka_bootstrap, tmp_path, "snapmsg", ["truncated"], rows=200)
    s.cfg.write_text(s.cfg.read_text().replace("[source]\n", "[source]\nmessages = false\n", 1))
    try:
        s.start()
        s.wait("the copy of the first table", s.copying_first)
        t = s.tables["truncated"]
        s.pg.run(f"truncate {t}")
        s.pg.run(f"insert into {t} values (1, 1, 'after')")
        s.proc.wait(timeout=60)
        text = s.log.read_text()
        assert s.proc.returncode not in (0, None), text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        lines = [ln for ln in text.splitlines() if "source.messages" in ln]
        assert len(lines) == 1 and "could not copy" in lines[0] and t in lines[0], text[-3000:]
        assert not _initial_done(kafka_bootstrap, s.slot)
        confirmed = s.pg.one("select confirmed_flush_lsn::text from pg_replication_slots "
                             "where slot_name = %s", s.slot)
        assert confirmed is not None
        # the slot's consistent point: nothing of the stream was confirmed
        assert s.pg.one("select %s::pg_lsn < min(lsn) from (select pg_current_wal_lsn() "
                        "as lsn) x", confirmed)
        # the next start says the same in one line, before streaming anything
        again = start_router(s.cfg, tmp_path / "again.log")
        again.wait(timeout=60)
        text = (tmp_path / "again.log").read_text()
        assert again.returncode not in (0, None) and "Traceback" not in text, text[-3000:]
        assert len([ln for ln in text.splitlines() if "source.messages" in ln]) == 1, text
        assert s.pg.one("select confirmed_flush_lsn::text from pg_replication_slots "
                        "where slot_name = %s", s.slot) == confirmed
    finally:
        s.close()


def _waiting_for(pg, table: str, pid: int) -> bool:
    return pg.one("select count(*) > 0 from pg_locks l where not l.granted and l.relation = "
                  "%s::regclass and l.pid <> %s", table, pid)


@pytest.mark.parametrize("kind", ["drop", "rename"])
def test_a_table_dropped_or_renamed_while_the_snapshot_waits_for_it(pg_dsn, kafka_bootstrap,
                                                                    tmp_path, kind):
    """A transaction holds the table exclusively when the snapshot comes to read it (after
    its name was looked up), then drops or renames it and commits: the snapshot leaves it
    (no read error, no restart) and copies the renamed table by backfill. Every topic of a
    table that exists folds to it; the dropped table's topic gets no rows."""
    import psycopg2

    s = _Snapshot(pg_dsn, kafka_bootstrap, tmp_path, f"snap{kind}", ["held", "after"],
                  rows=300)
    held = s.tables["held"]
    renamed = f"{held}_renamed"
    ddl = psycopg2.connect(pg_dsn)
    try:
        s.start()
        s.wait("the copy of the first table", s.copying_first)
        with ddl.cursor() as cur:
            cur.execute(f"lock table {held} in access exclusive mode")
        s.wait("the snapshot to wait for the held table",
               lambda: _waiting_for(s.pg, held, ddl.get_backend_pid()))
        with ddl.cursor() as cur:
            cur.execute(f"drop table {held}" if kind == "drop"
                        else f"alter table {held} rename to {renamed}")
        ddl.commit()
        if kind == "rename":
            s.pg.run(f"update {renamed} set v = 'changed' where id <= 5")
        s.finish()
        text = s.log.read_text()
        assert "Traceback" not in text and "restarting" not in text, text[-3000:]
        tables = {"first": s.first, "after": s.tables["after"]}
        if kind == "rename":
            tables["renamed"] = renamed
        wrong = s.wrong(tables)
        assert not wrong, f"{wrong}\n{text[-3000:]}"
        assert not [r for r in read_topic(kafka_bootstrap, s.topic(held), missing_ok=True)
                    if r["value"] and r["value"]["op"] == "r"]
    finally:
        ddl.close()
        s.close(extra_tables=[renamed])


def test_ddl_on_the_table_being_read_waits_for_the_copy(pg_dsn, kafka_bootstrap, tmp_path):
    """ALTER TABLE on the table the snapshot is reading waits for the copy (the reader holds
    its lock), then commits; the changes after it are streamed: the topic folds to the
    table, the added column included."""
    import threading

    import psycopg2

    s = _Snapshot(pg_dsn, kafka_bootstrap, tmp_path, "snapnow", ["next"], rows=300)
    errors = []

    def alter():
        try:
            conn = psycopg2.connect(pg_dsn)
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f"alter table {s.first} add column x int")
                cur.execute(f"update {s.first} set x = id where id % 1000 = 0")
                cur.execute(f"alter table {s.first} drop column v")
            conn.close()
        except Exception as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)

    try:
        s.start()
        s.wait("the copy of the first table", s.copying_first)
        thread = threading.Thread(target=alter)
        thread.start()
        s.finish()
        thread.join(timeout=30)
        assert not thread.is_alive() and not errors, errors
        s.proc = start_router(s.cfg, s.log)  # the changes after the snapshot
        _caught_up(s.pg, s.slot, s.proc, s.log, s.deadline)
        _stop(s.proc)
        text = s.log.read_text()
        assert "Traceback" not in text and "restarting" not in text, text[-3000:]
        wrong = s.wrong({"first": s.first, **s.tables})
        assert not wrong, f"{wrong}\n{text[-3000:]}"
    finally:
        s.close()


@pytest.mark.parametrize("kill_at", ["after_ddl", "in_backfill"])
def test_tables_changed_at_once_then_kill9(pg_dsn, kafka_bootstrap, tmp_path, kill_at):
    """One transaction truncates a table, retypes another (a rewrite) and adds a column with
    a default to a third, while the snapshot reads the first table; the router is killed
    with SIGKILL right after the commit (or once the backfill of those tables started) and
    started again: every table ends complete."""
    import psycopg2

    kinds = ["truncated", "retyped", "added"]
    s = _Snapshot(pg_dsn, kafka_bootstrap, tmp_path, "snapkill", kinds)
    t = s.tables
    try:
        s.start()
        s.wait("the copy of the first table", s.copying_first)
        ddl = psycopg2.connect(pg_dsn)  # one transaction
        with ddl, ddl.cursor() as cur:
            cur.execute(f"truncate {t['truncated']}")
            cur.execute(f"insert into {t['truncated']} select g, -g, 'after' "
                        "from generate_series(1, 40) g")
            cur.execute(f"alter table {t['retyped']} alter column n type bigint")
            cur.execute(f"alter table {t['added']} add column x int default 7")
            for name in t.values():
                cur.execute(f"update {name} set v = 'changed' where id between 3 and 9")
        ddl.close()
        if kill_at == "in_backfill":
            s.wait("the backfill", lambda: "backfill requested" in s.log.read_text())
        kill9(s.proc)
        s.start()
        s.finish()
        text = s.log.read_text()
        assert "Traceback" not in text and "restarting" not in text, text[-3000:]
        wrong = s.wrong({"first": s.first, **t})
        assert not wrong, f"{wrong}\n{text[-3000:]}"
    finally:
        s.close()


@pytest.mark.parametrize("when", ["before_restart", "in_backfill"])
def test_vacuum_full_between_a_kill_and_the_ranges_left_out(pg_dsn, kafka_bootstrap,
                                                            tmp_path, when):
    """An initial snapshot split in block ranges is killed after a range was recorded done;
    the rows of the first half are deleted and VACUUM FULL packs the others into the
    blocks of the ranges done — before the restart, or while the backfill that finishes
    the snapshot (leaving out those ranges) runs. No row moved into those blocks is lost."""
    from router.snapshot.ranges import MIN_RANGE_BLOCKS
    from tests.e2e import test_snapshot_ranges as ranges

    pg = Pg(pg_dsn)
    name = unique("snapvf")
    slot = f"{name}_slot"
    topic = f"{slot}.t"
    pg.run(f"create table {name} (id int primary key, n int, v text) with (fillfactor = 10)")
    pg.run(f"insert into {name} select g, 0, 'v' || g || repeat('x', 330) "
           f"from generate_series(1, {ranges.ROWS}) g")
    pg.run(f"vacuum analyze {name}")
    assert pg.one(f"select pg_relation_size('{name}') / 8192") >= 2 * MIN_RANGE_BLOCKS
    pg.run(f"create publication {name} for table {name}")
    source = _SlowSource(pg_dsn)
    source.proxy.rate = ranges.SLOW_LINK
    log = tmp_path / "router.log"
    deadline = time.monotonic() + DEADLINE
    proc = start_router(ranges._config(tmp_path, source.dsn, kafka_bootstrap, name, slot), log)

    def pack():
        pg.run(f"delete from {name} where id <= {ranges.ROWS // 2}")
        pg.run(f"vacuum full {name}")

    try:
        _wait("a range done", lambda: "initial snapshot: range done" in log.read_text(), proc,
              log, deadline)
        kill9(proc)
        assert "initial snapshot done" not in log.read_text(), "the kill came too late"
        if when == "before_restart":
            pack()
        proc = start_router(ranges._config(tmp_path, source.dsn, kafka_bootstrap, name, slot),
                            log)
        if when == "in_backfill":
            _wait("the backfill", lambda: "leaves out the block ranges" in log.read_text(),
                  proc, log, deadline)
            pack()
        _wait("the snapshot finished by backfill",
              lambda: "initial snapshot finished by backfill" in log.read_text(), proc, log,
              deadline)
        _caught_up(pg, slot, proc, log, deadline)
        _stop(proc)
        got = folded(kafka_bootstrap, topic, COLS)
        want = table_rows(pg.conn, name, COLS)
        assert got == want, (f"{len(got)} rows in the topic, {len(want)} in the table; "
                             f"e.g. {sorted(want ^ got, key=str)[:3]}\n"
                             f"{log.read_text()[-3000:]}")
    finally:
        _stop(proc)
        source.close()
        pg.drop_slot(slot)
        pg.run(f"drop publication if exists {name}")
        pg.run(f"drop table if exists {name}")
        delete_topics(kafka_bootstrap, [topic])
        pg.close()


#: DDL on a partitioned table ``{p}`` (partitions ``{p}_1`` … ``{p}_3``, ids 1-3000) while
#: a backfill of it waits for its first partition: committed before the backfill reads
PARTITION_DDL = {
    "truncate_partition": ["truncate {p}_2",
                           "insert into {p} select g, -g, 'after' from generate_series(1001, "
                           "1040) g"],
    "retype_root": ["alter table {p} alter column n type bigint"],
    "detach": ["alter table {p} detach partition {p}_2"],
    "drop_partition": ["drop table {p}_2"],
    "attach": ["create table {p}_4 (id int not null, n int, v text)",
               "insert into {p}_4 select g, g, 'v' || g from generate_series(3001, 3300) g",
               "alter table {p} attach partition {p}_4 for values from (3001) to (4001)"],
}


@pytest.mark.parametrize("kind", sorted(PARTITION_DDL))
def test_ddl_on_a_partitioned_table_during_its_backfill(pg_dsn, kafka_bootstrap, tmp_path,
                                                        kind):
    """``pgrouter snapshot`` of a table published via its root; a transaction that holds the
    first partition changes the partitions (a partition truncated, the root retyped, a
    partition detached, dropped or attached) and commits while the backfill's first chunk
    waits. The root's topic, folded, is ``SELECT`` of the root at the end."""
    import psycopg2

    from tests.e2e.test_backfill import progress, snapshot_cmd

    pg = Pg(pg_dsn)
    p = unique("bfpart")
    slot, route = f"{p}_slot", f"r_{p}"
    topic = f"{route}.public.{p}"
    pg.run(f"create table {p} (id int primary key, n int, v text) partition by range (id)")
    for i in (1, 2, 3):
        pg.run(f"create table {p}_{i} partition of {p} for values from ({(i - 1) * 1000 + 1}) "
               f"to ({i * 1000 + 1})")
    pg.run(f"insert into {p} select g, g, 'v' || g from generate_series(1, 3000) g")
    pg.run(f"create publication {p} for table {p} with (publish_via_partition_root = true)")
    cfg, log, proc, deadline = _start_for_backfills(
        tmp_path, pg_dsn, kafka_bootstrap, slot, p,
        f'[[routes]]\nname = "{route}"\npublications = ["{p}"]\n',
        "chunk_rows = 400\nparallel = 1\n")
    ddl = psycopg2.connect(pg_dsn)
    try:
        _slot_active(pg, slot, proc, log, deadline)
        with ddl.cursor() as cur:
            cur.execute(f"lock table {p}_1 in access exclusive mode")
            asked = snapshot_cmd(cfg, route, f"public.{p}")
            assert asked.returncode == 0, asked.stderr
            _wait("the chunk to wait for the first partition",
                  lambda: _waiting_for(pg, f"{p}_1", ddl.get_backend_pid()), proc, log,
                  deadline)
            for sql in PARTITION_DDL[kind]:
                cur.execute(sql.format(p=p))
        ddl.commit()
        pg.run(f"update {p} set v = 'changed' where id in (5, 1005, 2005)")
        # the partitions still under the root at the end, each done (a count of "done"
        # records can be reached by the dropped partition before the last one is copied)
        kept = {f"public.{p}_{i}" for i in
                ((1, 3) if kind in ("detach", "drop_partition") else (1, 2, 3))}
        _wait("the backfill", lambda: kept <= {x["table"] for x in
                                               progress(kafka_bootstrap, slot)
                                               if x["state"] == "done"}, proc, log, deadline)
        if kind == "attach":
            # the stream carries no rows for an ATTACH, and the backfill's partitions were
            # planned before it: the new partition is copied by a request of its own
            asked = snapshot_cmd(cfg, route, f"public.{p}_4")
            assert asked.returncode == 0, asked.stderr
            _wait("the new partition's backfill", lambda: any(
                x["state"] == "done" and x["table"] == f"public.{p}_4"
                for x in progress(kafka_bootstrap, slot)), proc, log, deadline)
        _caught_up(pg, slot, proc, log, deadline)
        _stop(proc)
        text = log.read_text()
        got = folded(kafka_bootstrap, topic, COLS)
        want = table_rows(pg.conn, p, COLS)
        assert got == want, (f"{len(got)} rows in the topic, {len(want)} in the table; "
                             f"e.g. {sorted(want ^ got, key=str)[:3]}\n{text[-3000:]}")
        assert "Traceback" not in text and "restarting" not in text, text[-3000:]
    finally:
        _stop(proc)
        ddl.close()
        pg.drop_slot(slot)
        pg.run(f"drop publication if exists {p}")
        pg.run(f"drop table if exists {p}, {p}_2, {p}_4")
        delete_topics(kafka_bootstrap, [topic])
        pg.close()
