"""A start of ``pgrouter run`` that copies an initial snapshot asks PostgreSQL on one session
until its slot is made and plans the copy on that session too, and reads the catalog twice:
for the checks before the slot exists, then in the slot's exported snapshot, which the
copy is planned from (each connection and each catalog read is part of every start's
time; the second read is what makes a table that joined a publication meanwhile part of
the copy: tests/e2e/test_snapshot_publication_race.py). What the real command's process opened is read from it at its exit: every
connection (asyncpg for SQL, psycopg2 for the slot's replication connections) and every
read of the catalog's tables, in order."""

from __future__ import annotations

import pytest

from tests.e2e.sources import new_table, run_probed, source_config, table_route
from tests.helpers import drop_source

pytestmark = pytest.mark.services

#: records each connection and each catalog read, prints them at exit, then runs
#: ``pgrouter`` as ``python -m actors.cli``
PROBE = """
import atexit, runpy, sys
import asyncpg, psycopg2
import actors.services.catalog as catalog
out, seen = sys.argv.pop(1), []
sql, replication, tables = asyncpg.connect, psycopg2.connect, catalog.load_tables
async def sql_connect(*a, **k):
    seen.append("sql")
    return await sql(*a, **k)
def replication_connect(*a, **k):
    seen.append("replication")
    return replication(*a, **k)
async def load_tables(*a, **k):
    seen.append("catalog")
    return await tables(*a, **k)
asyncpg.connect, psycopg2.connect, catalog.load_tables = sql_connect, replication_connect, load_tables
atexit.register(lambda: open(out, "w").write("\\n".join(seen)))
sys.argv[0] = "pgrouter"
runpy.run_module("actors.cli", run_name="__main__")
"""


def test_an_initial_snapshot_start_uses_one_session_and_two_catalog_reads(
        pg_dsn, kafka_bootstrap, tmp_path):
    pg, name = new_table(pg_dsn, "ses", "id int primary key, v text")
    pg.run(f"create publication {name} for table {name}")
    pg.run(f"insert into {name} values (1, 'a')")
    cfg = source_config(tmp_path / "router.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra='client = "librdkafka"',
                        extra='[snapshot]\nmode = "initial"\nparallel = 1\n',
                        routes=table_route(name))
    seen_file = tmp_path / "seen.txt"
    try:
        stderr = run_probed(PROBE, seen_file, cfg)
        assert "initial snapshot: done tables=1 rows=1" in stderr, stderr[-3000:]
        seen = seen_file.read_text().split()
        # the first replication connection creates the slot with its exported snapshot
        made = seen.index("replication")
        assert seen[:made] == ["sql", "catalog"], seen
        # the copy planned on the same session, in the exported snapshot: no new connection
        assert seen[made + 1] == "catalog" and seen.count("catalog") == 2, seen
        # after it: the snapshot's own sessions, then the stream's replication connection
        assert seen[-1] == "replication" and seen.count("replication") == 2, seen
    finally:
        drop_source(pg, name, kafka_bootstrap, (name,))
