"""PostgreSQL → pgrouter → Kafka on the real stack: every kind of change arrives on the right
topic, in commit order, with the documented envelope, and the topics fold back into exactly
the rows PostgreSQL holds."""

from __future__ import annotations

import pytest

from tests.e2e.sources import drop_made, new_table, source_config
from tests.helpers import (Pg, fold_rows, pg_text, read_topic, run_router, unique,
                           write_config)

pytestmark = pytest.mark.services



def pg_rows(pg: Pg, table: str, key: list[str]) -> dict:
    cols = [r[0] for r in pg.run(
        "select attname from pg_attribute where attrelid = %s::regclass and attnum > 0 "
        "and not attisdropped order by attnum", table)]
    out = {}
    for row in pg.run(f"select {', '.join(f'{c}::text' for c in cols)} from {table}"):
        d = dict(zip(cols, row))
        out[tuple(d[k] for k in key)] = d
    return out


def diff_rows(expected: dict, got: dict) -> dict:
    """key -> {column: (expected, got)} for every difference (short failure messages)."""
    out = {}
    for k in expected.keys() | got.keys():
        e, g = expected.get(k, {}), got.get(k, {})
        cols = {c: (e.get(c), g.get(c)) for c in e.keys() | g.keys() if e.get(c) != g.get(c)}
        if cols or (k in expected) != (k in got):
            out[k] = cols or ("missing" if k not in got else "unexpected")
    return out


def topic_rows(records, key: list[str]) -> dict:
    folded = fold_rows(records, key)
    return {tuple(pg_text(k) for k in kk): {c: pg_text(v) for c, v in row.items()}
            for kk, row in folded.items()}


@pytest.fixture
def env(pg_dsn, kafka_bootstrap, tmp_path):
    pg = Pg(pg_dsn)
    name = unique("pipe")
    tables = {"pk": f"{name}_pk", "full": f"{name}_full", "idx": f"{name}_idx",
              "fullpk": f"{name}_fullpk"}
    pg.run(f"create table {tables['pk']} (id int primary key, qty int, price numeric(10,2), "
           f"note text, ok bool, at timestamptz, f float8)")
    pg.run(f"alter table {tables['pk']} alter column note set storage external")
    pg.run(f"create table {tables['full']} (a int, b text)")
    pg.run(f"alter table {tables['full']} replica identity full")
    pg.run(f"create table {tables['fullpk']} (id int primary key, v text)")
    pg.run(f"alter table {tables['fullpk']} replica identity full")
    pg.run(f"create table {tables['idx']} (id int not null, code text not null, v text)")
    pg.run(f"create unique index {tables['idx']}_ux on {tables['idx']} (code)")
    pg.run(f"alter table {tables['idx']} replica identity using index {tables['idx']}_ux")
    pg.run(f"create publication {name} for table {', '.join(tables.values())}")
    routes = f"""
[[routes]]
name = "{name}"
tables = [{', '.join(f'"public.{t}"' for t in tables.values())}]
topic = "{{route}}.{{table}}"

[[routes]]
name = "{name}_ins"
tables = ["public.{tables['pk']}"]
operations = ["insert"]
topic = "{{route}}"
"""
    dsn = pg_dsn + ("&" if "?" in pg_dsn else "?") + "options=-c%20logical_decoding_work_mem%3D64kB"
    cfg = write_config(tmp_path / "router.toml", dsn=dsn, slot=name, publications=[name],
                       bootstrap=kafka_bootstrap, routes=routes,
                       kafka_extra="position_headers = true")
    yield pg, name, tables, cfg
    pg.drop_slot(name)
    pg.run(f"drop publication {name}")
    for t in tables.values():
        pg.run(f"drop table {t}")
    pg.close()


@pytest.mark.pg_matrix
def test_every_change_kind_arrives_in_order_and_folds_to_the_table(env, kafka_bootstrap):
    pg, name, t, cfg = env
    run_router(cfg)  # creates the slot; nothing to send yet
    big = "x" + "".join(f"{i:05d}" for i in range(4000))  # ~20 kB, stored out of line
    pg.run(f"insert into {t['pk']} values (1, 1, 9.99, %s, true, '2024-01-02 03:04:05.5+00', 1.5),"
           f" (2, 2, 0.5, 'short', false, null, 'NaN')", big)
    pg.run(f"update {t['pk']} set qty = 10 where id = 1")               # note stays TOASTed
    pg.run(f"update {t['pk']} set id = 3 where id = 2")                 # key change
    pg.run(f"delete from {t['pk']} where id = 3")
    pg.run(f"insert into {t['full']} values (1, 'one'), (2, 'two')")
    pg.run(f"update {t['full']} set b = 'uno' where a = 1")
    pg.run(f"delete from {t['full']} where a = 2")
    pg.run(f"insert into {t['fullpk']} values (1, 'a')")
    pg.run(f"update {t['fullpk']} set v = 'b' where id = 1")
    pg.run(f"insert into {t['idx']} values (1, 'c1', 'v'), (2, 'c2', 'w')")
    pg.run(f"update {t['idx']} set code = 'c9' where code = 'c1'")
    pg.run(f"truncate {t['idx']}")
    pg.run(f"insert into {t['idx']} values (5, 'c5', 'after truncate')")
    # a large transaction, streamed by the walsender (logical_decoding_work_mem = 64kB)
    pg.run(f"insert into {t['pk']} (id, qty, note) select g, g, md5(g::text) "
           f"from generate_series(100, 3099) g")
    # two-phase: the committed one arrives, the rolled-back one never does
    pg.run("begin")
    pg.run(f"insert into {t['pk']} (id, qty) values (50, 50)")
    pg.run(f"prepare transaction '{name}_g1'")
    pg.run(f"commit prepared '{name}_g1'")
    pg.run("begin")
    pg.run(f"insert into {t['pk']} (id, qty) values (51, 51)")
    pg.run(f"prepare transaction '{name}_g2'")
    pg.run(f"rollback prepared '{name}_g2'")

    run_router(cfg)

    streamed = pg.one("select stream_txns from pg_stat_replication_slots where slot_name = %s",
                      name)
    assert streamed >= 1, "the large transaction was expected to be streamed"
    main = read_topic(kafka_bootstrap, f"{name}.{t['pk']}")
    positions = [(r["value"]["source"]["commit_lsn"], r["value"]["source"]["seq"]) for r in main]
    assert positions == sorted(positions), "records of one partition are in commit order"
    assert len(set(positions)) == len(positions), "one record per position"

    by_op = {}
    for r in main:
        by_op.setdefault(r["value"]["op"], []).append(r)
    first = by_op["c"][0]
    assert first["key"] == {"id": 1}
    assert first["value"]["after"] == {"id": 1, "qty": 1, "price": "9.99", "note": big,
                                       "ok": True, "at": "2024-01-02 03:04:05.5+00", "f": 1.5}
    src = first["value"]["source"]
    assert src["schema"] == "public" and src["table"] == t["pk"] and src["route"] == name
    assert src["xid"] > 0 and src["lsn"] <= src["commit_lsn"] and src["origin"] is None
    assert first["headers"]["pgrouter.commit_lsn"] == str(src["commit_lsn"]).encode()
    assert by_op["c"][1]["value"]["after"]["f"] == "NaN"
    toast_update = by_op["u"][0]["value"]
    assert toast_update["unchanged_toast"] == ["note"] and "note" not in toast_update["after"]
    key_change = by_op["u"][1]
    assert key_change["key"] == {"id": 3} and key_change["value"]["before"] == {"id": 2}
    assert by_op["d"][0]["value"]["before"] == {"id": 3} and by_op["d"][0]["key"] == {"id": 3}
    expected, got = pg_rows(pg, t["pk"], ["id"]), topic_rows(main, ["id"])
    assert diff_rows(expected, got) == {}

    full = read_topic(kafka_bootstrap, f"{name}.{t['full']}")
    upd = [r["value"] for r in full if r["value"]["op"] == "u"][0]
    assert upd["before"] == {"a": 1, "b": "one"}, "REPLICA IDENTITY FULL carries the old row"
    # REPLICA IDENTITY FULL: PostgreSQL marks every column as part of the identity
    assert [r["key"] for r in full][:2] == [{"a": 1, "b": "one"}, {"a": 2, "b": "two"}]
    dele = [r["value"] for r in full if r["value"]["op"] == "d"][0]
    assert dele["before"] == {"a": 2, "b": "two"}

    fullpk = read_topic(kafka_bootstrap, f"{name}.{t['fullpk']}")
    assert [r["key"] for r in fullpk] == [{"id": 1}, {"id": 1}], \
        "REPLICA IDENTITY FULL with a primary key: the primary key is the record key"
    assert fullpk[1]["value"]["before"] == {"id": 1, "v": "a"}

    idx = read_topic(kafka_bootstrap, f"{name}.{t['idx']}")
    assert [r["value"]["op"] for r in idx] == ["c", "c", "u", "t", "c"]
    assert idx[2]["key"] == {"code": "c9"} and idx[2]["value"]["before"] == {"code": "c1"}
    assert diff_rows(pg_rows(pg, t["idx"], ["code"]), topic_rows(idx, ["code"])) == {}

    inserts_only = read_topic(kafka_bootstrap, f"{name}_ins")
    assert {r["value"]["op"] for r in inserts_only} == {"c"}
    assert len(inserts_only) == 2 + 3000 + 1
    ids = {r["key"]["id"] for r in inserts_only}
    assert 50 in ids and 51 not in ids

    confirmed = pg.one("select confirmed_flush_lsn::text from pg_replication_slots "
                       "where slot_name = %s", name)
    last_commit = max(p[0] for p in positions)
    assert int(confirmed.split("/")[0], 16) << 32 | int(confirmed.split("/")[1], 16) >= last_commit


def test_rerun_sends_nothing_new_once_confirmed(env, kafka_bootstrap):
    pg, name, t, cfg = env
    run_router(cfg)
    pg.run(f"insert into {t['pk']} (id, qty) values (1, 1)")
    run_router(cfg)
    run_router(cfg)
    assert len(read_topic(kafka_bootstrap, f"{name}.{t['pk']}")) == 1


@pytest.mark.pg_matrix
def test_logical_decoding_messages_go_to_the_messages_topic(pg_dsn, kafka_bootstrap, tmp_path):
    pg, name = new_table(pg_dsn, "msg", "id int primary key")
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=f'messages_topic = "{name}.msgs"',
                        routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n')
    try:
        run_router(cfg)
        prefix = f"audit_{name}"  # every slot of the database decodes a non-transactional one
        pg.run(f"select pg_logical_emit_message(false, '{prefix}', 'outside')")
        pg.run("begin")
        pg.run(f"insert into {name} values (1)")
        pg.run(f"select pg_logical_emit_message(true, '{prefix}', "
               "convert_to('inside é', 'UTF8'))")
        pg.run("commit")
        pg.run("begin")
        pg.run(f"select pg_logical_emit_message(true, '{prefix}', 'rolled back')")
        pg.run("rollback")
        run_router(cfg)
        msgs = [r["value"] for r in read_topic(kafka_bootstrap, f"{name}.msgs")
                if r["value"]["message"]["prefix"] == prefix]
        import base64
        got = [(m["op"], m["message"]["transactional"],
                base64.b64decode(m["message"]["content"]).decode(), m["source"]["xid"] is None)
               for m in msgs]
        assert got == [("m", False, "outside", True), ("m", True, "inside é", False)]
    finally:
        drop_made(pg, name, if_exists=False)


def test_toasted_key_that_did_not_change_keeps_the_record_key(pg_dsn, kafka_bootstrap, tmp_path):
    pg, name = new_table(pg_dsn, "tkey", "k text primary key, v int")
    pg.run(f"alter table {name} alter column k set storage external")
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name)
    try:
        run_router(cfg)
        big = "".join(f"{i:04d}" for i in range(600))  # 2,400 bytes, stored out of line
        pg.run(f"insert into {name} values (%s, 1)", big)
        pg.run(f"update {name} set v = 2")
        run_router(cfg)
        records = read_topic(kafka_bootstrap, name)
        assert [r["key"] for r in records] == [{"k": big}, {"k": big}]
        assert records[1]["value"]["after"]["v"] == 2
    finally:
        drop_made(pg, name, if_exists=False)
