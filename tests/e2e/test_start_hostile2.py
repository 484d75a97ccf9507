"""A start that copies an initial snapshot and waits before making its slot: a table added
to the slot's publication while it waits is in the snapshot (its rows were committed before
the slot's consistent point, so the stream never carries them).

The wait is the one every start without [ha] makes for a router copying the slot's
initial snapshot: a session named as that copy's connection (``slots.copy_name``) holds
the start in ``Source.wait_free``; the test waits for its log line, not for a time."""

from __future__ import annotations

import subprocess
import sys
import time

import psycopg2
import pytest

from actors.services.slots import copy_name
from tests.e2e.sources import new_table, source_config
from tests.helpers import ROOT, drop_source, read_topic

pytestmark = pytest.mark.services


def test_a_table_published_while_the_start_waits_is_copied(pg_dsn, kafka_bootstrap, tmp_path):
    pg, name = new_table(pg_dsn, "pubwait", "id int primary key, v text")
    late = f"{name}_late"
    pg.run(f"create table {late} (id int primary key, v text)")
    for table in (name, late):
        pg.run(f"insert into {table} select g, 'v' || g from generate_series(1, 100) g")
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "router.toml", pg_dsn, kafka_bootstrap, name,
                        extra='[snapshot]\nmode = "initial"\n',
                        routes=f'[[routes]]\nname = "{name}"\npublication = "{name}"\n'
                               f'topic = "{name}"\n')
    log = tmp_path / "router.log"
    holder = psycopg2.connect(pg_dsn, application_name=copy_name(name))
    try:
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "actors.cli", "run", "-c", str(cfg),
                                     "--until-caught-up"], stdout=out,
                                    stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + 60
        while "waiting for the slot" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        pg.run(f"alter publication {name} add table {late}")
        holder.close()
        assert proc.wait(timeout=180) == 0, log.read_text()[-3000:]
        tables = [r["value"]["source"]["table"] for r in read_topic(kafka_bootstrap, name)]
        assert tables.count(late) == 100, (tables.count(name), tables.count(late))
    finally:
        holder.close()
        pg.run(f"drop table if exists {late}")
        drop_source(pg, name, kafka_bootstrap, (name,))
