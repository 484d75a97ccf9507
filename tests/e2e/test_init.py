"""``pgrouter init`` against the real stack: a database with several publications (one with a
row filter, one with a row filter and a column list) gets a starter config that passes
``pgrouter check`` at once and, run with ``--until-caught-up``, fills one topic per publication
and table with exactly what the publication replicates. Never overwrites without ``--force``;
a wrong DSN, a database without publications, a role without REPLICATION and an unreachable
Kafka are one line each, and nothing is written."""

from __future__ import annotations

import subprocess
import sys

import psycopg2
import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.sources import own_database
from tests.helpers import ROOT, Pg, read_topic

pytestmark = pytest.mark.services


def pgrouter(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], capture_output=True,
                          text=True, timeout=180, cwd=cwd)


@pytest.fixture
def database(pg_dsn):
    """A database of its own: init describes every publication of the database it is given."""
    yield from own_database(pg_dsn, "init")


def test_init_writes_a_config_that_checks_and_runs(database, kafka_bootstrap, tmp_path):
    name, dsn = database
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"""
            create table orders(id int primary key, amount numeric, status text);
            create table customers(id int primary key, name text, country text);
            alter table orders replica identity full;
            alter table customers replica identity full;
            insert into orders values (1, 50, 'new'), (2, 150, 'paid');
            insert into customers values (1, 'Ada', 'DE'), (2, 'Bo', 'US');
            create publication {name}_all for table orders, customers;
            create publication {name}_big for table orders where (amount > 100);
            create publication {name}_eu for table customers (id, country)
                where (country = 'DE');""")
    cfg = tmp_path / "pgrouter.toml"
    made = pgrouter("init", "--dsn", dsn, "--kafka", kafka_bootstrap, "--slot", name,
                    "-o", str(cfg))
    assert made.returncode == 0, made.stderr
    assert f"3 route(s)" in made.stdout
    text = cfg.read_text()
    assert "# " in text and f'publication = "{name}_eu"' in text
    checked = pgrouter("check", "-c", str(cfg))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip().splitlines()[-1] == "ok"

    again = pgrouter("init", "--dsn", dsn, "--slot", "other", "-o", str(cfg))
    assert again.returncode == 1 and "--force" in again.stderr
    assert cfg.read_text() == text, "overwritten without --force"

    topics = [f"{name}_all.public.orders", f"{name}_all.public.customers",
              f"{name}_big.public.orders", f"{name}_eu.public.customers"]
    try:
        ran = pgrouter("run", "-c", str(cfg), "--until-caught-up")
        assert ran.returncode == 0, ran.stderr[-3000:]
        got = {t: sorted((r["value"]["after"] for r in read_topic(kafka_bootstrap, t)),
                         key=lambda row: row["id"]) for t in topics}
        assert [r["id"] for r in got[topics[0]]] == [1, 2]
        assert [r["id"] for r in got[topics[1]]] == [1, 2]
        assert [r["id"] for r in got[topics[2]]] == [2]
        assert got[topics[3]] == [{"id": 1, "country": "DE"}]
    finally:
        delete_topics(kafka_bootstrap, topics)

    forced = pgrouter("init", "--dsn", dsn, "--slot", "other", "-o", str(cfg), "--force")
    assert forced.returncode == 0, forced.stderr
    assert 'slot = "other"' in cfg.read_text()


def one_line_refusal(args: list[str], out, *expected: str) -> None:
    done = pgrouter("init", *args, "-o", str(out))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pgrouter init: "), done.stderr
    for part in expected:
        assert part in lines[0], lines[0]
    assert not out.exists()


def test_init_refuses_with_one_line(database, pg_dsn, tmp_path):
    name, dsn = database
    out = tmp_path / "pgrouter.toml"
    one_line_refusal(["--dsn", "postgresql://postgres@127.0.0.1:1/postgres"], out,
                     "cannot connect to")
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("create table t(id int primary key)")
    one_line_refusal(["--dsn", dsn], out, "has no publication", "CREATE PUBLICATION")
    role = f"{name}_norepl"
    admin = Pg(pg_dsn)
    admin.run(f"create role {role} login")
    try:
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            cur.execute(f"create publication {name}_p for table t")
        norepl = dsn.replace("postgres@", f"{role}@", 1)
        one_line_refusal(["--dsn", norepl], out, f"role '{role}' has no REPLICATION")
        one_line_refusal(["--dsn", dsn, "--kafka", "127.0.0.1:1"], out, "cannot reach Kafka")
    finally:
        admin.run(f"drop role {role}")
        admin.close()


def test_init_output_checks_with_filter_and_column_list_on_one_table(database, tmp_path):
    """A row-filter publication and a column-list publication of one table cannot share a
    slot (PostgreSQL refuses two column lists for one table), and the slot streaming only
    one of them cannot feed the other's route: that route is written commented out with
    what to do, said on stdout, and ``check`` accepts the file."""
    name, dsn = database
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"""
            create table t(id int primary key, a int, b text, c text);
            create publication {name}_rows for table t where (a > 1);
            create publication {name}_cols for table t (id, b);""")
    cfg = tmp_path / "pgrouter.toml"
    made = pgrouter("init", "--dsn", dsn, "--slot", name, "-o", str(cfg))
    assert made.returncode == 0, made.stderr
    checked = pgrouter("check", "-c", str(cfg))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip().splitlines()[-1] == "ok"
    assert f"not routed: publication '{name}_cols'" in made.stdout, made.stdout
    text = cfg.read_text()
    assert f'publications = ["{name}_rows"]' in text and "# NOT ROUTED" in text, text


def test_init_escapes_newlines_and_refuses_a_bad_slot_name(database, tmp_path):
    """A newline in a table name and in a row filter's literal, a quote, a backslash and a
    character beyond U+FFFF: the file is valid TOML (``check`` accepts it) and holds the
    names as the catalog spells them. A slot name PostgreSQL refuses is one line naming
    --slot, not the file."""
    name, dsn = database
    table = 'new\nline "q" \\ 😀'
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"""
            create table "{table.replace('"', '""')}"(id int primary key, v text);
            create publication "{name} p\n😀" for table "{table.replace('"', '""')}"
                where (v <> E'x\\ny');""")
    cfg = tmp_path / "pgrouter.toml"
    made = pgrouter("init", "--dsn", dsn, "--slot", name, "-o", str(cfg))
    assert made.returncode == 0, made.stderr
    import tomllib

    doc = tomllib.loads(cfg.read_text())
    assert doc["source"]["publications"] == [f"{name} p\n😀"]
    assert [r["publication"] for r in doc["routes"]] == [f"{name} p\n😀"]
    checked = pgrouter("check", "-c", str(cfg))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    one_line_refusal(["--dsn", dsn, "--slot", "Bad Slot"], tmp_path / "bad.toml",
                     "--slot 'Bad Slot'", "lower-case letters, digits and underscores")
