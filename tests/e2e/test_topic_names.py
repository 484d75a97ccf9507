"""Topic names on the real stack: identifiers Kafka cannot hold and identifiers that would
collide get the documented escaped names; a topic Kafka would refuse is reported by
``check`` and refused by ``run`` with one line, before anything is streamed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.sources import source_config
from tests.helpers import ROOT, Pg, read_topic, run_router, unique

pytestmark = pytest.mark.services


def pgrouter(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture
def odd_tables(pg_dsn):
    pg = Pg(pg_dsn)
    name = unique("tn")
    dotted = f"{name}.x"  # schema "<name>.x" and schema "<name>" with table "x.t"
    pg.run(f'create schema "{dotted}"')
    pg.run(f'create schema "{name}"')
    pg.run(f'create table "{dotted}".t (id int primary key, v text)')
    pg.run(f'create table "{name}"."x.t" (id int primary key, v text)')
    pg.run(f'create table "{name}"."Grüße ""q""" (id int primary key, v text)')
    pg.run(f'create publication {name} for tables in schema "{dotted}", "{name}"')
    yield pg, name
    pg.drop_slot(name)
    pg.run(f"drop publication {name}")
    pg.run(f'drop schema if exists "{dotted}", "{name}", "{name}_x" cascade')
    pg.close()


def test_odd_identifiers_get_distinct_legal_topics(odd_tables, kafka_bootstrap, tmp_path):
    pg, name = odd_tables
    cfg = source_config(tmp_path / "router.toml", pg.dsn, kafka_bootstrap, name,
                        routes=f'[[routes]]\nname = "r"\npublication = "{name}"\n')
    proc = pgrouter("check", "-c", str(cfg))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_router(cfg)
    pg.run(f'insert into "{name}.x".t values (1, \'dotted schema\')')
    pg.run(f'insert into "{name}"."x.t" values (1, \'dotted table\')')
    pg.run(f'insert into "{name}"."Grüße ""q""" values (1, \'odd\')')
    run_router(cfg)
    got = {}
    for topic in (f"r.{name}-2ex.t", f"r.{name}.x-2et", f"r.{name}.Gr-c3-bc-c3-9fe-20-22q-22"):
        got[topic] = [r["value"]["after"]["v"] for r in read_topic(kafka_bootstrap, topic)]
    assert list(got.values()) == [["dotted schema"], ["dotted table"], ["odd"]], got


def test_topic_kafka_would_refuse_is_reported_and_refused(odd_tables, kafka_bootstrap,
                                                          tmp_path):
    pg, name = odd_tables
    long = "é" * 31  # 62 bytes: 186 characters escaped, four times over 249
    pg.run(f'create table "{name}"."{long}" (id int primary key)')
    cfg = source_config(tmp_path / "router.toml", pg.dsn, kafka_bootstrap, name,
                        routes=f'[[routes]]\nname = "r"\npublication = "{name}"\n'
                               f'topic = "{{route}}.{{schema}}.{{table}}.{{table}}"\n'
                               f'[[routes]]\nname = "s"\nschemas = ["{name}", "{name}_x"]\n'
                               f'topic = "{{route}}.{{schema}}_{{table}}"\n')
    # "<name>"."x_y" and "<name>_x"."y": one topic under {schema}_{table}
    pg.run(f'create table "{name}"."x_y" (id int primary key)')
    pg.run(f'create schema "{name}_x"')
    pg.run(f'create table "{name}_x"."y" (id int primary key)')
    proc = pgrouter("check", "-c", str(cfg))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("routes[0].topic: table ") and "249" in ln for ln in lines), lines
    assert any(ln.startswith("routes[1].topic: ") and "would share topic" in ln
               for ln in lines), lines
    proc = pgrouter("run", "-c", str(cfg), "--until-caught-up")
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "routes[0].topic" in err[0] and "249" in err[0], err


def test_table_created_later_with_a_topic_kafka_would_refuse_stops_the_router(
        odd_tables, kafka_bootstrap, tmp_path):
    from tests.helpers import start_router

    pg, name = odd_tables
    cfg = source_config(tmp_path / "router.toml", pg.dsn, kafka_bootstrap, name,
                        routes=f'[[routes]]\nname = "r"\nschemas = ["{name}"]\n'
                               f'topic = "{{route}}.{{schema}}.{{table}}.{{table}}"\n')
    log = tmp_path / "router.log"
    run_router(cfg)
    proc = start_router(cfg, log)
    try:
        long = "é" * 31  # 186 characters escaped, twice: over 249
        pg.run(f'create table "{name}"."{long}" (id int primary key)')
        pg.run(f'insert into "{name}"."{long}" values (1)')
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
        assert code == 2, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    last = log.read_text().strip().splitlines()[-1]
    assert "configuration error" in last and "249" in last and f"table {name}." in last, last
    # nothing was confirmed past the change that could not be published
    assert pg.one("select confirmed_flush_lsn < pg_current_wal_lsn() from pg_replication_slots "
                  "where slot_name = %s", name)
