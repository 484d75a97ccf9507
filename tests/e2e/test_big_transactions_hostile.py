"""Large transactions the server sends at their commit (``streaming = false``), produced in
parts, read back by a plain consumer that is not pgrouter's: per key the last value wins, a
delete or a tombstone removes it. A ``kill -9`` while the parts go out, then a restart: the
folded topics equal the tables (at-least-once), and a ``read_committed`` consumer sees each
change once (exactly-once), with key changes, deletes of rows the transaction inserted,
unchanged TOAST, a column added mid-transaction, a TRUNCATE and a logical message at its end,
many transactions just past the part threshold back to back, and a router stopped
(SIGSTOP) mid-parts while a second router on the same config is refused the slot."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.e2e.guarantee import topic_size, wait_for
from tests.e2e.test_exactly_once import read_committed
from tests.helpers import (ROOT, Pg, drop_source, kill9, read_topic, router_cmd, run_router,
                           start_router, unique, write_config)

pytestmark = pytest.mark.services
MEMORY_LIMIT = 2 * 1024 * 1024
BIG = "(select string_agg(md5(i::text || 'k'), '') from generate_series(1, 120) i)"


@pytest.fixture
def source(pg_dsn, kafka_bootstrap, tmp_path):
    pg = Pg(pg_dsn)
    name = unique("bighost")
    other = f"{name}_o"
    pg.run(f"create table {name} (id bigint primary key, n int, payload text, big text)")
    pg.run(f"create table {other} (id bigint primary key, v text)")
    pg.run(f"create publication {name} for table {name}, {other}")
    # made here, before the router starts: no initial snapshot, and its consistent point
    # is before every transaction the test writes (the router may wait for it otherwise)
    pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", name)
    pg.run(f"insert into {other} select g, 'old' from generate_series(1, 50) g")

    def config(*, exactly_once: bool):
        eo = (f'exactly_once = true\ncommitted_lsn_topic = "{name}.progress"\n'
              if exactly_once else "")
        routes = "".join(
            f'[[routes]]\nname = "{t}"\ntables = ["public.{t}"]\ntopic = "{t}"\n'
            f'tombstones = true\ntopic_settings = {{ partitions = {n} }}\n'
            for t, n in ((name, 3), (other, 1)))
        return write_config(
            tmp_path / f"router-{exactly_once}.toml", dsn=pg.dsn, slot=name,
            publications=[name], bootstrap=kafka_bootstrap,
            source_extra=(f"streaming = false\nmemory_limit = {MEMORY_LIMIT}\n"
                          f'spill_dir = "{tmp_path}"'),
            kafka_extra=(f'client = "librdkafka"\nmessages_topic = "{name}.msgs"\n' + eo),
            routes=routes)

    yield pg, name, other, config
    pg.run(f"drop table if exists {other}")
    drop_source(pg, name, kafka_bootstrap,
                (name, other, f"{name}.progress", f"{name}.msgs"))


def mixed_transaction(name: str, other: str, rows: int) -> str:
    """One transaction: inserts far past the part threshold, updates with unchanged TOAST,
    key changes, deletes of rows it inserted, a column added and a type changed in the
    middle, more rows after, and a TRUNCATE and a logical message at its very end."""
    return f"""
    insert into {other} values (1000, 'in-tx');
    insert into {name} select g, g % 7, repeat('x', 50), null from generate_series(1, {rows}) g;
    update {name} set big = {BIG} || id where id <= 200;
    update {name} set n = n + 100 where id <= {rows // 3};
    update {name} set id = id + 10000000 where id between {rows // 3 + 1} and {rows // 3 + 500};
    delete from {name} where id between {rows // 2} and {rows // 2 + 3000};
    alter table {name} add column extra text default 'dflt';
    alter table {name} alter column n type bigint;
    insert into {name} select g, 1, 'after-alter', null, 'e' || g
        from generate_series({rows + 1}, {rows + 20000}) g;
    update {name} set extra = 'u' || id, n = n * 2 where id between 10 and 12000;
    delete from {name} where id between {rows + 15000} and {rows + 16000};
    truncate {other};
    insert into {other} values (7, 'after-truncate');
    select pg_logical_emit_message(true, 'hostile', 'end');
    """


def plain_fold(records) -> dict:
    """(key bytes or JSON, value dict or None) in each partition's order -> key -> row."""
    rows: dict = {}
    for key, value in records:
        k = json.dumps(key, sort_keys=True) if not isinstance(key, (bytes, str)) else key
        if value is not None and value["op"] == "t":
            rows.clear()  # a truncate's record: keyless; one partition so in order
        elif value is None or value["op"] == "d":
            rows.pop(k, None)
        elif value["op"] in ("c", "r", "u"):
            after = dict(value["after"])
            for col in value.get("unchanged_toast") or []:
                after[col] = rows.get(k, {}).get(col)
            rows[k] = after
    return rows


def table(pg: Pg, name: str) -> dict:
    cols = [c for (c,) in pg.run("select column_name from information_schema.columns "
                                 "where table_name = %s order by ordinal_position", name)]
    return {r[0]: dict(zip(cols, r)) for r in pg.run(f"select * from {name}")}


def by_id(folded: dict, defaults: dict) -> dict:
    """Rows by id; a column added after a row's last change is its default."""
    return {row["id"]: {**defaults, **row} for row in folded.values()}


def alo_records(bootstrap, topic):
    return [(r["key"], r["value"] and json.loads(r["value"]))
            for r in read_topic(bootstrap, topic, timeout=180, decode=False)]


def eo_records(bootstrap, topic):
    return [(k, None if v is None else json.loads(v))
            for _, k, v in read_committed(bootstrap, topic, timeout=180)]


def wait_streaming(pg, name, proc) -> None:
    """Until the router ``proc`` streams the slot ``name`` (or has exited)."""
    wait_for(lambda: pg.run("select 1 from pg_replication_slots where slot_name = %s "
                            "and active", name) or proc.poll() is not None,
             timeout=120, what="the router to stream")


def kill_mid_parts(pg, name, config_path, bootstrap, tmp_path, sql: str) -> None:
    """The router started, ``sql`` committed as one transaction, the router killed once
    records of it are in Kafka (mostly before its Commit was handled)."""
    log = tmp_path / "killed.log"
    proc = start_router(config_path, log)
    try:
        wait_streaming(pg, name, proc)
        assert proc.poll() is None, log.read_text()[-3000:]
        pg.run("begin;" + sql + "commit;")
        wait_for(lambda: topic_size(bootstrap, name) or proc.poll() is not None,
                 timeout=300, interval=0.02, what="the first part in Kafka")
        assert proc.poll() is None, log.read_text()[-3000:]
        kill9(proc)
    finally:
        kill9(proc)


def same(folded: dict, rows: dict) -> None:
    wrong = sorted(k for k in folded.keys() | rows.keys() if folded.get(k) != rows.get(k))
    assert not wrong, (f"{len(wrong)} rows differ (topic {len(folded)}, table {len(rows)}), "
                       f"first: " + "; ".join(f"{k}: {folded.get(k)} != {rows.get(k)}"
                                              for k in wrong[:3]))


def check(pg, name, other, bootstrap, read, defaults=None) -> list:
    main = read(bootstrap, name)
    same(by_id(plain_fold(main), defaults or {}), table(pg, name))
    same(by_id(plain_fold(read(bootstrap, other)), {}), table(pg, other))
    return main


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_kill_mid_parts_of_a_mixed_transaction(source, kafka_bootstrap, tmp_path, exactly_once):
    pg, name, other, config = source
    cfg = config(exactly_once=exactly_once)
    kill_mid_parts(pg, name, cfg, kafka_bootstrap, tmp_path,
                   mixed_transaction(name, other, 30_000))
    run_router(cfg, timeout=400)
    main = check(pg, name, other, kafka_bootstrap,
                 eo_records if exactly_once else alo_records, {"extra": "dflt"})
    if exactly_once:
        positions = [(v["source"]["commit_lsn"], v["source"]["seq"]) for _, v in main if v]
        assert len(positions) == len(set(positions)), "a change twice for read_committed"
        ours = {v["source"]["commit_lsn"] for _, v in main if v}
        msgs = [json.loads(v) for _, _, v in read_committed(kafka_bootstrap, f"{name}.msgs")]
        assert [m["message"] for m in msgs if m["source"]["commit_lsn"] in ours] == [
            {"prefix": "hostile", "transactional": True, "content": "ZW5k"}]


def test_exactly_once_back_to_back_transactions_past_the_threshold(source, kafka_bootstrap,
                                                                   tmp_path):
    pg, name, other, config = source
    cfg = config(exactly_once=True)
    sql = ";".join(f"begin; insert into {name} select g, {i}, 'p' from "
                   f"generate_series({i * 9000 + 1}, {(i + 1) * 9000}) g; "
                   f"update {name} set n = -n where id % 1000 = 0; commit"
                   for i in range(8))
    log = tmp_path / "b2b.log"
    proc = start_router(cfg, log)
    try:
        wait_streaming(pg, name, proc)
        pg.run(sql)
        wait_for(lambda: topic_size(kafka_bootstrap, name) > 20_000 or proc.poll() is not None,
                 timeout=300, interval=0.02, what="records of several transactions")
        assert proc.poll() is None, log.read_text()[-3000:]
        kill9(proc)
    finally:
        kill9(proc)
    run_router(cfg, timeout=400)
    main = check(pg, name, other, kafka_bootstrap, eo_records)
    positions = [(v["source"]["commit_lsn"], v["source"]["seq"]) for _, v in main if v]
    assert len(positions) == len(set(positions)), "a change twice for read_committed"
    assert len(positions) == 8 * 9000 + sum(9 * (i + 1) for i in range(8))


def test_exactly_once_stopped_mid_parts_and_a_second_router(source, kafka_bootstrap,
                                                            tmp_path):
    pg, name, other, config = source
    cfg = config(exactly_once=True)
    log = tmp_path / "stopped.log"
    proc = start_router(cfg, log)
    try:
        wait_streaming(pg, name, proc)
        pg.run("begin;" + mixed_transaction(name, other, 30_000) + "commit;")
        end = pg.one("select pg_current_wal_lsn()::text")
        wait_for(lambda: topic_size(kafka_bootstrap, name) or proc.poll() is not None,
                 timeout=300, interval=0.02, what="the first part in Kafka")
        os.killpg(proc.pid, signal.SIGSTOP)
        second = subprocess.run(router_cmd(cfg, "--until-caught-up"), capture_output=True,
                                text=True, timeout=120, cwd=ROOT)
        # the slot is held by the stopped router: the second waits, then refuses
        assert second.returncode != 0 and "in use by another router" in second.stderr
        os.killpg(proc.pid, signal.SIGCONT)
        wait_for(lambda: not pg.one("select confirmed_flush_lsn < %s::pg_lsn from "
                                    "pg_replication_slots where slot_name = %s", end, name)
                 or proc.poll() is not None, timeout=300, what="the confirmation")
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        kill9(proc)
    run_router(cfg, timeout=400)
    main = check(pg, name, other, kafka_bootstrap, eo_records, {"extra": "dflt"})
    positions = [(v["source"]["commit_lsn"], v["source"]["seq"]) for _, v in main if v]
    assert len(positions) == len(set(positions)), "a change twice for read_committed"
