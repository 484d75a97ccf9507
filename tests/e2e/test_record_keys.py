"""The record key of a table with a primary key is its primary key, whatever happens to the
catalog while the router runs (``ALTER TABLE … REPLICA IDENTITY``, other DDL) and across a
restart: every record of one row carries one key and lands on one partition."""

from __future__ import annotations

import signal
import time

import pytest

from tests.helpers import Pg, read_topic, run_router, start_router, unique, write_config

pytestmark = pytest.mark.services


def _wait_records(bootstrap: str, topic: str, count: int, proc, log, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        recs = read_topic(bootstrap, topic, missing_ok=True, settle=0)  # polled: no settling
        if len(recs) >= count:
            return recs
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.3)
    raise AssertionError(f"{topic}: fewer than {count} records after {timeout}s\n"
                         + log.read_text()[-3000:])


def test_key_stays_the_primary_key_across_replica_identity_changes(pg_dsn, kafka_bootstrap,
                                                                   tmp_path):
    pg = Pg(pg_dsn)
    name = unique("rkey")
    # the route takes the test's own schema, so the table created while the router runs is
    # routed without being named before it exists (a route naming a missing table is refused)
    pg.run(f"create schema {name}")
    pg.run(f"set search_path = {name}")
    pg.run(f"create table {name} (id int primary key, n int not null)")
    pg.run(f"create unique index {name}_idn on {name} (id, n)")
    pg.run(f"create publication {name} for table {name}")
    topic = f"r.{name}"
    cfg = write_config(tmp_path / "router.toml", dsn=pg_dsn, slot=name, publications=[name],
                       bootstrap=kafka_bootstrap,
                       routes=f'[[routes]]\nname = "r"\nschemas = ["{name}"]\n'
                              f'topic = "{{route}}.{{table}}"\n'
                              f'topic_settings = {{ partitions = 3 }}\n')
    log = tmp_path / "router.log"
    proc = None
    try:
        run_router(cfg)  # creates the slot while the table has REPLICA IDENTITY DEFAULT
        proc = start_router(cfg, log)
        pg.run(f"insert into {name} values (1, 0)")
        for n in range(1, 4):
            pg.run(f"update {name} set n = {n} where id = 1")
        _wait_records(kafka_bootstrap, topic, 4, proc, log)
        pg.run(f"create table {name}_late (v int, k text primary key)")
        pg.run(f"alter table {name}_late replica identity full")
        pg.run(f"alter publication {name} add table {name}_late")
        pg.run(f"insert into {name}_late values (1, 'a')")
        pg.run(f"update {name}_late set v = 2")
        pg.run(f"update {name}_late set v = 3")
        pg.run(f"delete from {name}_late")
        pg.run(f"alter table {name} replica identity full")
        for n in range(4, 8):
            pg.run(f"update {name} set n = {n} where id = 1")
        pg.run(f"alter table {name} add column note text")
        pg.run(f"update {name} set n = 8, note = 'x' where id = 1")
        pg.run(f"alter table {name} replica identity using index {name}_idn")
        pg.run(f"update {name} set n = 9 where id = 1")
        _wait_records(kafka_bootstrap, topic, 10, proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
        proc = None
        # a restart with the table FULL in the catalog, then back to DEFAULT
        pg.run(f"alter table {name} replica identity full")
        pg.run(f"update {name} set n = 10 where id = 1")
        pg.run(f"alter table {name} replica identity default")
        pg.run(f"update {name} set n = 11 where id = 1")
        pg.run(f"delete from {name} where id = 1")
        run_router(cfg)
        recs = read_topic(kafka_bootstrap, topic)
        recs.sort(key=lambda r: (r["value"]["source"]["commit_lsn"], r["value"]["source"]["seq"]))
        assert [r["value"]["op"] for r in recs] == ["c"] + ["u"] * 11 + ["d"]
        assert {(r["raw"][0]) for r in recs} == {b'{"id":1}'}, [r["key"] for r in recs]
        assert len({r["partition"] for r in recs}) == 1
        assert recs[-2]["value"]["after"] == {"id": 1, "n": 11, "note": "x"}
        # a table created FULL while the router ran: its primary key is looked up
        late = read_topic(kafka_bootstrap, f"r.{name}_late")
        late.sort(key=lambda r: (r["value"]["source"]["commit_lsn"], r["value"]["source"]["seq"]))
        assert [r["value"]["op"] for r in late] == ["c", "u", "u", "d"]
        assert {r["raw"][0] for r in late} == {b'{"k":"a"}'}
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        pg.drop_slot(name)
        pg.run(f"drop publication {name}")
        pg.run(f"drop schema {name} cascade")
        pg.close()
