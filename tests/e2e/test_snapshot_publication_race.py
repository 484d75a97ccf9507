"""A table added to the slot's publication while a first start creates its slot with an
initial snapshot: its rows were committed before the slot's consistent point, so the
stream never carries them, and the snapshot must copy them.

CREATE_REPLICATION_SLOT waits for every transaction that holds an xid when it begins: a
session that wrote something and has not committed holds the slot's creation (after the
start read the publication's tables) until it commits. The test waits until the router's
walsender waits for that transaction's lock, adds a table to the publication (and changes
a row of it) and drops another from it, then lets the creation finish. Each topic, folded
by a plain consumer (``read_topic``: confluent-kafka), equals ``SELECT``; the table dropped
from the publication before the consistent point has no records, as a subscription made
then would copy none of it."""

from __future__ import annotations

import subprocess
import sys
import time

import psycopg2
import pytest

from tests.e2e.sources import new_table, source_config
from tests.helpers import (ROOT, drop_source, fold_rows, pg_text, read_topic, table_rows,
                           topic_rows)

pytestmark = pytest.mark.services

#: the router's walsender creating the slot, waiting for a running transaction's xid
CREATING = ("select count(*) > 0 from pg_stat_activity where backend_type = 'walsender' "
            "and query like %s and wait_event_type = 'Lock' and wait_event = 'transactionid'")


def test_a_table_published_while_the_slot_is_created_is_copied(pg_dsn, kafka_bootstrap,
                                                               tmp_path):
    pg, name = new_table(pg_dsn, "pubrace", "id int primary key, v text")
    late, gone, scratch = f"{name}_late", f"{name}_gone", f"{name}_scratch"
    for table in (late, gone):
        pg.run(f"create table {table} (id int primary key, v text)")
        pg.run(f"insert into {table} select g, 'v' || g from generate_series(1, 150) g")
    pg.run(f"create table {scratch} (id int)")
    pg.run(f"insert into {name} select g, 'v' || g from generate_series(1, 100) g")
    pg.run(f"create publication {name} for table {name}, {gone}")
    cfg = source_config(tmp_path / "router.toml", pg_dsn, kafka_bootstrap, name,
                        extra='[snapshot]\nmode = "initial"\n',
                        routes=f'[[routes]]\nname = "{name}"\npublication = "{name}"\n'
                               f'topic = "{{route}}.{{table}}"\n')
    log = tmp_path / "router.log"
    holder = psycopg2.connect(pg_dsn)  # its open transaction holds the slot's creation
    proc = None
    try:
        with holder.cursor() as cur:
            cur.execute(f"insert into {scratch} values (1)")
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "actors.cli", "run", "-c", str(cfg),
                                     "--until-caught-up"], stdout=out,
                                    stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + 90
        while not pg.one(CREATING, f"%CREATE_REPLICATION_SLOT%{name}%"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        pg.run(f"alter publication {name} add table {late}")
        pg.run(f"alter publication {name} drop table {gone}")
        pg.run(f"update {late} set v = 'changed' where id = 7")  # before the consistent point
        holder.commit()
        assert proc.wait(timeout=180) == 0, log.read_text()[-3000:]
        cols = ["id", "v"]
        assert topic_rows(kafka_bootstrap, f"{name}.{name}", ["id"], cols) == \
            table_rows(pg.conn, name, cols)
        # a topic never made (no record of the table at all) folds to no rows
        folded = fold_rows(read_topic(kafka_bootstrap, f"{name}.{late}", missing_ok=True,
                                      settle=0), ["id"])
        got = {tuple(pg_text(row.get(c)) for c in cols) for row in folded.values()}
        assert got == table_rows(pg.conn, late, cols), (len(got), log.read_text()[-3000:])
        assert ("7", "changed") in got
        assert read_topic(kafka_bootstrap, f"{name}.{gone}", missing_ok=True, settle=0) == []
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        holder.close()
        pg.run(f"drop table if exists {late}, {gone}, {scratch}")
        drop_source(pg, name, kafka_bootstrap,
                    tuple(f"{name}.{t}" for t in (name, late, gone)))
