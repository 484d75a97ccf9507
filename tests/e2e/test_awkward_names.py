"""Names that need quoting, end to end on the real stack: schemas, tables, columns and
publications with spaces, capitals, double and single quotes, dots, unicode, a reserved word
and a newline. ``pgrouter init`` writes a config for them, ``check`` passes it, ``run``
streams the initial snapshot and later changes into Kafka (read with a plain consumer), and
a backfill and ``verify`` work on such a table. A slot name PostgreSQL would refuse is one
line from ``check`` saying what a slot name may hold."""

from __future__ import annotations

import subprocess
import sys
import time

import psycopg2
import pytest

from router.routing.topics import escape
from tests.e2e.guarantee import delete_topics
from tests.e2e.sources import own_database
from tests.helpers import ROOT, fold_rows, kill9, read_topic, start_router

pytestmark = pytest.mark.services

#: (schema, table) pairs, each with the columns KEY and VALUE
TABLES = [("public", "two words"), ("public", "MixedCase"), ("public", 'quo"te'),
          ("public", "it's"), ("public", "dot.ted"), ("public", "ünï😀"),
          ("public", "select"), ("public", "new\nline"), ("My Schema.x", "Tab\"le 'x'")]
KEY, VALUE = "Key Col", "va\"l'ue"
#: publication -> its definition (FOR …)
PUBLICATIONS = {
    "two words": 'TABLE "two words", "MixedCase" WHERE ("Key Col" > 1)',
    "All Tables": "ALL TABLES",
    "pub\"q'.x": 'TABLES IN SCHEMA "My Schema.x"',
    "ünï pub": 'TABLE "ünï😀", "select", "new\nline", "quo""te", "it\'s", "dot.ted"',
}


def q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def pgrouter(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], capture_output=True,
                          text=True, timeout=180, cwd=ROOT)


def route_of(pub: str) -> str:
    """The route name ``init`` gives a publication (Kafka's characters only)."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in pub)


@pytest.fixture
def database(pg_dsn):
    yield from own_database(pg_dsn, "awk")


def expected(cur, pub: str, schema: str, table: str) -> dict:
    """What the publication replicates of the table, by key, from PostgreSQL itself."""
    where = ' where "Key Col" > 1' if (pub, table) == ("two words", "MixedCase") else ""
    cur.execute(f"select {q(KEY)}, {q(VALUE)} from {q(schema)}.{q(table)}{where}")
    return {(k,): {KEY: k, VALUE: v} for k, v in cur.fetchall()}


def topics_of(pub: str, tables) -> dict:
    route = route_of(pub)
    return {f"{route}.{escape(s)}.{escape(t)}": (s, t) for s, t in tables}


def test_awkward_names_init_check_run_backfill_verify(database, kafka_bootstrap, tmp_path):
    name, dsn = database
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f"create schema {q('My Schema.x')}")
        for s, t in TABLES:
            cur.execute(f"create table {q(s)}.{q(t)} ({q(KEY)} int primary key, "
                        f"{q(VALUE)} text)")
            cur.execute(f"insert into {q(s)}.{q(t)} select g, %s || g from "
                        "generate_series(1, 3) g", (t,))
        for pub, what in PUBLICATIONS.items():
            cur.execute(f"create publication {q(pub)} for {what}")
    cfg = tmp_path / "awkward.toml"
    made = pgrouter("init", "--dsn", dsn, "--kafka", kafka_bootstrap, "--slot", name,
                    "-o", str(cfg))
    assert made.returncode == 0, made.stderr
    checked = pgrouter("check", "-c", str(cfg))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    members = {"two words": TABLES[:2], "All Tables": TABLES, "pub\"q'.x": TABLES[-1:],
               "ünï pub": TABLES[2:8]}
    topics = {}
    for pub, tables in members.items():
        topics.update({topic: (pub, s, t) for topic, (s, t) in topics_of(pub, tables).items()})
    log = tmp_path / "router.log"
    proc = None
    try:
        ran = pgrouter("run", "-c", str(cfg), "--until-caught-up")
        assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr[-4000:]
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            for s, t in TABLES:  # changes streamed after the snapshot
                cur.execute(f"insert into {q(s)}.{q(t)} values (4, 'four')")
                cur.execute(f"update {q(s)}.{q(t)} set {q(VALUE)} = 'two' where {q(KEY)} = 2")
                cur.execute(f"delete from {q(s)}.{q(t)} where {q(KEY)} = 3")
        ran = pgrouter("run", "-c", str(cfg), "--until-caught-up")
        assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr[-4000:]
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            for topic, (pub, s, t) in topics.items():
                records = read_topic(kafka_bootstrap, topic)
                assert {(r["value"]["source"]["schema"], r["value"]["source"]["table"])
                        for r in records} == {(s, t)}, topic
                assert fold_rows(records, [KEY]) == expected(cur, pub, s, t), topic

        # a backfill of one awkward table while the router streams, then verify
        s, t = TABLES[2]
        topic = f"{route_of('ünï pub')}.{escape(s)}.{escape(t)}"
        copied = sum(r["value"]["op"] == "r" for r in read_topic(kafka_bootstrap, topic))
        proc = start_router(cfg, log)
        asked = pgrouter("snapshot", "-c", str(cfg), "--route", route_of("ünï pub"),
                         "--table", f"{s}.{t}")
        assert asked.returncode == 0, asked.stdout + asked.stderr
        deadline = time.monotonic() + 60
        while "backfill: table done" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        verified = pgrouter("verify", "-c", str(cfg), "--route", route_of("ünï pub"),
                            "--table", f"{s}.{t}", "--wait", "60")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        records = read_topic(kafka_bootstrap, topic)
        assert sum(r["value"]["op"] == "r" for r in records) == copied + 3, records

        # a schema holding a dot is named with SQL's double quotes ("s"."t"), on both commands
        s, t = TABLES[-1]
        route, name = route_of("pub\"q'.x"), f"{q(s)}.{q(t)}"
        asked = pgrouter("snapshot", "-c", str(cfg), "--route", route, "--table", name)
        assert asked.returncode == 0, asked.stdout + asked.stderr
        while log.read_text().count("backfill: table done") < 2:
            assert time.monotonic() < deadline + 60 and proc.poll() is None, \
                log.read_text()[-3000:]
            time.sleep(0.2)
        verified = pgrouter("verify", "-c", str(cfg), "--route", route, "--table", name,
                            "--wait", "60")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        if proc is not None:
            kill9(proc)
        delete_topics(kafka_bootstrap, list(topics))
    assert "Traceback" not in (log.read_text() if log.exists() else "")


def test_a_slot_name_postgresql_refuses_is_one_line(tmp_path, pg_dsn, kafka_bootstrap):
    cfg = tmp_path / "bad-slot.toml"
    cfg.write_text(f'[source]\ndsn = "{pg_dsn}"\nslot = "My Slot"\npublications = ["p"]\n'
                   f'[kafka]\nbootstrap_servers = "{kafka_bootstrap}"\n'
                   '[[routes]]\nname = "r"\ntables = ["public.t"]\n')
    checked = pgrouter("check", "-c", str(cfg))
    assert checked.returncode != 0
    out = (checked.stdout + checked.stderr).strip()
    assert "source.slot" in out and "lower-case letters, digits and underscores" in out, out
    assert "Traceback" not in out
