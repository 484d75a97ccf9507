"""Hostile streamed transactions on the real stack (logical_decoding_work_mem = 64kB, a
memory_limit small enough to spill): DDL between the rows of one streamed transaction,
savepoints rolled back, two big transactions streamed at once, an abort, a transactional
logical message in the middle, TOAST unchanged values and REPLICA IDENTITY FULL; the topics
fold back into exactly what PostgreSQL holds."""

from __future__ import annotations

import re
import threading

import psycopg2
import pytest

from tests.helpers import (Pg, fold_rows, pg_text, read_topic, run_router, unique,
                           write_config)

pytestmark = pytest.mark.services


def _table_text(pg: Pg, table: str, key: str) -> dict:
    cols = [r[0] for r in pg.run(
        "select attname from pg_attribute where attrelid = %s::regclass and attnum > 0 "
        "and not attisdropped order by attnum", table)]
    rows = pg.run(f"select {', '.join(f'{c}::text' for c in cols)} from {table}")
    return {r[cols.index(key)]: dict(zip(cols, r)) for r in rows}


def _topic_text(records, key: str, columns) -> dict:
    folded = fold_rows(records, [key])
    return {pg_text(k[0]): {c: pg_text(row.get(c)) for c in columns}
            for k, row in folded.items()}


@pytest.fixture
def stream_env(pg_dsn, kafka_bootstrap, tmp_path):
    pg = Pg(pg_dsn)
    name = unique("shx")
    pg.run(f"create publication {name}")
    made: list[str] = []

    def table(sql_cols: str, full: bool = False) -> str:
        t = f"{name}_{len(made)}"
        pg.run(f"create table {t} ({sql_cols})")
        if full:
            pg.run(f"alter table {t} replica identity full")
        pg.run(f"alter publication {name} add table {t}")
        made.append(t)
        return t

    def config(memory_limit: int = 200_000, source_extra: str = ""):
        dsn = pg_dsn + ("&" if "?" in pg_dsn else "?") + \
            "options=-c%20logical_decoding_work_mem%3D64kB"
        tables = ", ".join(f'"public.{t}"' for t in made)
        routes = (f'[[routes]]\nname = "{name}"\ntables = [{tables}]\n'
                  'topic = "{route}.{table}"\n')
        return write_config(tmp_path / "r.toml", dsn=dsn, slot=name, publications=[name],
                            bootstrap=kafka_bootstrap, routes=routes,
                            source_extra=f"memory_limit = {memory_limit}\n{source_extra}")

    yield pg, name, table, config
    pg.drop_slot(name)
    pg.run(f"drop publication {name}")
    for t in made:
        pg.run(f"drop table if exists {t} cascade")
    pg.close()


def _check(pg, kafka_bootstrap, name, t, key="id"):
    want = _table_text(pg, t, key)
    cols = next(iter(want.values())).keys() if want else [key]
    got = _topic_text(read_topic(kafka_bootstrap, f"{name}.{t}", settle=0), key, cols)
    diff = {k: (want.get(k), got.get(k)) for k in want.keys() | got.keys()
            if want.get(k) != got.get(k)}
    assert not diff, f"{len(diff)} rows differ, e.g. {list(diff.items())[:3]}"
    return len(want)


def test_ddl_and_savepoints_inside_one_streamed_transaction(stream_env, kafka_bootstrap):
    pg, name, table, config = stream_env
    t = table("id int primary key, a int, note text")
    pg.run(f"alter table {t} alter column note set storage external")
    cfg = config()
    run_router(cfg)
    big = "x" * 5000
    pg.run("begin")
    pg.run(f"insert into {t} select g, g, md5(g::text) from generate_series(1, 3000) g")
    pg.run(f"insert into {t} values (-1, -1, %s)", big)
    pg.run("savepoint s1")
    pg.run(f"insert into {t} select g, g, 'gone' from generate_series(3001, 6000) g")
    pg.run("rollback to savepoint s1")
    pg.run(f"alter table {t} add column b text default 'dflt'")
    pg.run(f"insert into {t} select g, g, 'b', 'bee' || g from generate_series(6001, 8000) g")
    pg.run("savepoint s2")
    pg.run(f"update {t} set a = a + 1 where id <= 1500")          # note unchanged (short)
    pg.run(f"update {t} set a = 7 where id = -1")                 # note TOAST unchanged
    pg.run("release savepoint s2")
    pg.run(f"alter table {t} alter column a type bigint")
    pg.run(f"insert into {t} select g, g * 1000000000::bigint, 'big', null "
           f"from generate_series(8001, 9000) g")
    pg.run(f"alter table {t} drop column b")
    pg.run(f"delete from {t} where id between 100 and 600")
    pg.run(f"insert into {t} select g, g, 'after drop' from generate_series(9001, 10000) g")
    pg.run("select pg_logical_emit_message(true, 'shx', 'middle')")
    pg.run(f"update {t} set note = 'late' where id between 9001 and 9100")
    pg.run("commit")
    run_router(cfg)
    assert pg.one("select stream_txns from pg_stat_replication_slots where slot_name = %s",
                  name) >= 1
    assert _check(pg, kafka_bootstrap, name, t) == 10000 - 3000 - 501 + 1


def _big_txn(dsn, t, lo, hi, abort=False, savepoint=False):
    conn = psycopg2.connect(dsn)
    try:
        cur = conn.cursor()
        for start in range(lo, hi, 500):
            cur.execute(f"insert into {t} select g, g, md5(g::text) "
                        f"from generate_series(%s, %s) g", (start, min(start + 499, hi - 1)))
            if savepoint and start % 1500 == 0:
                cur.execute("savepoint p")
                cur.execute(f"update {t} set a = -a where id between %s and %s",
                            (start, start + 100))
                cur.execute("rollback to savepoint p")
        conn.rollback() if abort else conn.commit()
    finally:
        conn.close()


def test_interleaved_and_aborted_streamed_transactions(stream_env, kafka_bootstrap):
    pg, name, table, config = stream_env
    t = table("id int primary key, a int, note text")
    f = table("a int, b text", full=True)
    cfg = config(memory_limit=100_000)
    run_router(cfg)
    pg.run(f"insert into {f} select g, 'v' || g from generate_series(1, 500) g")
    threads = [threading.Thread(target=_big_txn, args=(pg.dsn, t, lo, lo + 6000),
                                kwargs={"abort": lo == 20000, "savepoint": lo == 10000})
               for lo in (0, 10000, 20000, 30000)]
    for th in threads:
        th.start()
    pg.run("begin")
    pg.run(f"update {f} set b = b || repeat('z', 200)")
    pg.run(f"delete from {f} where a % 3 = 0")
    pg.run("commit")
    for th in threads:
        th.join()
    run_router(cfg)
    assert _check(pg, kafka_bootstrap, name, t) == 18000
    full = read_topic(kafka_bootstrap, f"{name}.{f}", settle=0)
    rows = {(r["a"], r["b"]) for r in fold_rows(full, ["a", "b"]).values()}
    assert rows == set(pg.run(f"select a, b from {f}"))


def test_streamed_prepare_and_partition_root(stream_env, kafka_bootstrap, pg_dsn):
    pg, name, table, config = stream_env
    t = table("id int primary key, a int, note text")
    p = f"{name}_p"
    pg.run(f"create table {p} (id int, region text, v text, primary key (id, region)) "
           f"partition by list (region)")
    pg.run(f"create table {p}_eu partition of {p} for values in ('eu')")
    pg.run(f"create table {p}_us partition of {p} for values in ('us')")
    pg.run(f"alter publication {name} add table {p}")
    pg.run(f"alter publication {name} set (publish_via_partition_root = true)")
    cfg = config(memory_limit=100_000, source_extra="two_phase = true")
    cfg.write_text(cfg.read_text().replace(f'"public.{t}"]', f'"public.{t}", "public.{p}"]'))
    try:
        run_router(cfg)
        pg.run("begin")
        pg.run(f"insert into {t} select g, g, md5(g::text) from generate_series(1, 5000) g")
        pg.run(f"insert into {p} select g, case when g % 2 = 0 then 'eu' else 'us' end, "
               f"'v' from generate_series(1, 4000) g")
        pg.run(f"update {p} set region = 'us', v = 'moved' where id between 1 and 400 "
               f"and region = 'eu'")
        pg.run(f"prepare transaction '{name}_a'")
        run_router(cfg)  # held: nothing of it yet
        pg.run(f"commit prepared '{name}_a'")
        pg.run("begin")
        pg.run(f"insert into {t} select g, g, 'no' from generate_series(5001, 9000) g")
        pg.run(f"prepare transaction '{name}_b'")
        pg.run(f"rollback prepared '{name}_b'")
        run_router(cfg)
        assert _check(pg, kafka_bootstrap, name, t) == 5000
        recs = read_topic(kafka_bootstrap, f"{name}.{p}", settle=0)
        got = {(pg_text(r["id"]), r["region"], r["v"])
               for r in fold_rows(recs, ["id", "region"]).values()}
        assert got == set(pg.run(f"select id::text, region, v from {p}"))
    finally:
        pg.run(f"drop table if exists {p} cascade")


@pytest.mark.parametrize("exactly_once", [False, True])
def test_kill9_while_a_streamed_transaction_is_received_and_replayed(stream_env,
                                                                      kafka_bootstrap,
                                                                      tmp_path, exactly_once):
    import time

    from tests.helpers import kill9, start_router
    pg, name, table, config = stream_env
    t = table("id int primary key, a int, note text")
    cfg = config(memory_limit=300_000)
    if exactly_once:
        cfg.write_text(cfg.read_text().replace("[kafka]\n", "[kafka]\nexactly_once = true\n"))
    run_router(cfg)
    conn = psycopg2.connect(pg.dsn)
    cur = conn.cursor()
    router = start_router(cfg, tmp_path / "r.log")
    for start in range(0, 60000, 10000):  # the router receives (and spills) while it grows
        cur.execute(f"insert into {t} select g, g, md5(g::text) || repeat('y', 100) "
                    f"from generate_series(%s, %s) g", (start, start + 9999))
        if start == 30000:
            cur.execute("savepoint s")
            cur.execute(f"delete from {t} where id < 5000")
            cur.execute("rollback to savepoint s")
            kill9(router)
            router = start_router(cfg, tmp_path / "r.log")
    conn.commit()
    conn.close()
    deadline = time.monotonic() + 60
    while not read_topic(kafka_bootstrap, f"{name}.{t}", missing_ok=True, settle=0):
        assert time.monotonic() < deadline, (tmp_path / "r.log").read_text()[-3000:]
        time.sleep(0.05)
    kill9(router)  # replaying the committed transaction
    run_router(cfg)
    assert _check(pg, kafka_bootstrap, name, t) == 60000
    if exactly_once:  # a read_committed consumer sees each row once
        from tests.e2e.test_exactly_once import read_committed
        keys = [k for _, k, _ in read_committed(kafka_bootstrap, f"{name}.{t}")]
        assert len(keys) == len(set(keys)) == 60000


_COLUMN = re.compile(r"(\w+)\[[^\]]+\]:")


def _server_columns(pg: Pg, slot: str, table: str) -> list[tuple]:
    """(op, id, column names) of each INSERT/UPDATE of ``table`` as test_decoding prints it."""
    out = []
    for (data,) in pg.run("select data from pg_logical_slot_get_changes(%s, null, null)", slot):
        head = f"table public.{table}: "
        if not data.startswith(head):
            continue
        op, _, rest = data[len(head):].partition(": ")
        if op in ("INSERT", "UPDATE"):
            cols = _COLUMN.findall(rest)
            ident = re.search(r"\bid\[[^\]]+\]:(-?\d+)", rest).group(1)
            out.append(({"INSERT": "c", "UPDATE": "u"}[op], ident, tuple(cols)))
    return out


@pytest.mark.parametrize("memory_limit", [100_000_000, 100_000])
def test_each_streamed_row_has_the_columns_in_effect_when_it_was_written(
        stream_env, kafka_bootstrap, memory_limit):
    """RENAME and DROP COLUMN between the rows of one streamed transaction: each record names
    the columns test_decoding prints for that row (rows kept raw must not be decoded with a
    relation sent after them)."""
    pg, name, table, config = stream_env
    t = table("id int primary key, a int, note text")
    cfg = config(memory_limit=memory_limit)
    run_router(cfg)
    oracle = f"{name}_td"
    pg.run("select pg_create_logical_replication_slot(%s, 'test_decoding')", oracle)
    try:
        pg.run("begin")
        pg.run(f"insert into {t} select g, g, md5(g::text) from generate_series(1, 2000) g")
        pg.run(f"alter table {t} rename column a to a2")
        pg.run(f"insert into {t} select g, g, md5(g::text) from generate_series(2001, 4000) g")
        pg.run(f"update {t} set a2 = -a2 where id % 500 = 0")
        pg.run(f"alter table {t} drop column note")
        pg.run(f"insert into {t} select g, g from generate_series(4001, 6000) g")
        pg.run(f"alter table {t} add column z text")
        pg.run(f"insert into {t} select g, g, 'z' from generate_series(6001, 8000) g")
        pg.run("commit")
        run_router(cfg)
        want = _server_columns(pg, oracle, t)
    finally:
        pg.run("select pg_drop_replication_slot(%s)", oracle)
    assert pg.one("select stream_txns from pg_stat_replication_slots where slot_name = %s",
                  name) >= 1
    recs = read_topic(kafka_bootstrap, f"{name}.{t}", settle=0)
    got = [(r["value"]["op"], str(r["value"]["after"]["id"]), tuple(r["value"]["after"]))
           for r in recs]
    assert len(got) == len(want) == 8000 + 8
    bad = [(w, g) for w, g in zip(want, got) if w != g]
    assert not bad, f"{len(bad)} records differ, e.g. {bad[:2]}"


def test_truncate_and_messages_between_streamed_rows(stream_env, kafka_bootstrap):
    pg, name, table, config = stream_env
    t = table("id int primary key, a int, note text")
    u = table("id int primary key, a int, note text")
    cfg = config(memory_limit=150_000)
    cfg.write_text(cfg.read_text().replace("[kafka]\n", f'[kafka]\nmessages_topic = "{name}.m"\n'))
    run_router(cfg)
    pg.run("begin")
    for i in range(3):
        pg.run(f"insert into {t} select g, g, md5(g::text) from generate_series(%s, %s) g",
               i * 2000, i * 2000 + 1999)
        pg.run(f"insert into {u} select g, g, 'u' from generate_series(%s, %s) g",
               i * 2000, i * 2000 + 1999)
        pg.run("select pg_logical_emit_message(true, %s, %s)", name, str(i))
        if i == 1:
            pg.run(f"truncate {t}")
    pg.run(f"update {u} set note = 'w' where id % 7 = 0")
    pg.run("commit")
    run_router(cfg)
    assert _check(pg, kafka_bootstrap, name, t) == 2000
    assert _check(pg, kafka_bootstrap, name, u) == 6000
    recs = read_topic(kafka_bootstrap, f"{name}.{t}", settle=0)
    ops = [r["value"]["op"] for r in recs]
    assert ops == ["c"] * 4000 + ["t"] + ["c"] * 2000
    # a slot decodes every logical message of its database: other tests' messages (the
    # outbox's, run in parallel) reach this topic too, so only this test's prefix counts
    msgs = [m for m in read_topic(kafka_bootstrap, f"{name}.m", settle=0)
            if m["value"]["message"]["prefix"] == name]
    assert len(msgs) == 3
