"""``pgrouter verify`` on the real stack: one router streams several routes while writers keep
writing; topics are damaged on purpose (rewritten with a record left out, a value altered, a
key added, the record holding a TOAST value left out) and verify must name exactly the
damage — and say equal where nothing was damaged: a table under writes, a route with a row
filter and a column list, a route without DELETE, a partitioned table published via its root,
a table without a key (a multiset). The record formats Connect and Avro are checked by
``test_verify_formats.py``.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.verify_stack import (Router, Writer, json_value, raw_records, result,
                                    rewrite_topic, verify, wait_for)
from tests.helpers import Pg, unique, write_config

pytestmark = pytest.mark.services

BIG_ROWS = 3000
DAMAGED = ("del", "alt", "extra", "toast")


@pytest.fixture(scope="module")
def stack(pg_dsn, kafka_bootstrap, tmp_path_factory):
    pg = Pg(pg_dsn)
    u = unique("vf")
    tmp = tmp_path_factory.mktemp(u)
    t = {name: f"{name}_{u}" for name in ("big", "dmg", "flt", "nd", "part", "kl")}
    pg.run(f"create type mood_{u} as enum ('sad', 'ok', 'happy')")
    pg.run(f"create table {t['big']}(id int primary key, n int, v text, num numeric(12,3), "
           "ts timestamptz default '2026-03-01 12:00:00.5+00', d date default '2026-02-28', "
           "j jsonb default '{\"a\": [1, 2.5, null]}', b bytea default '\\x00ff10', "
           "arr text[] default '{x,\"y z\",NULL}', f float8 default 0.1, flag bool, "
           f"m mood_{u} default 'ok', f4 float4 default 1.1, fnan float8 default 'NaN', "
           "finf float8 default '-Infinity', fbig float8 default 1e20, "
           "ftiny float8 default 1e-7, i2 int2 default 7, i8 int8 default 9000000000, "
           "numany numeric default 1.10, tsl timestamp default '2026-01-02 03:04:05.6', "
           "tm time default '01:02:03', iv interval default '1 mon 2 days 03:00:00', "
           "uid uuid default 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', "
           "js json default '{\"b\": 1,  \"a\": 2}', ch char(5) default 'ab', "
           "mon money default 12.34, ip inet default '10.0.0.1/24', "
           "rng int4range default '[1,5)', pt point default '(1,2)', "
           "ints int[] default '{1,NULL,3}', md int[] default '{{1,2},{3,4}}', "
           "uni text default 'Grüße ✓ \t tab')")
    pg.run(f"insert into {t['big']}(id, n, v, num, flag) select g, g, 'v' || g, g / 7.0, "
           f"g % 2 = 0 from generate_series(1, {BIG_ROWS}) g")
    pg.run(f"create table {t['dmg']}(id int primary key, v text, n int, big text)")
    pg.run(f"insert into {t['dmg']} select g, 'v' || g, g, null from generate_series(1, 40) g")
    # a TOASTed value (random, so it does not compress inline)
    pg.run(f"update {t['dmg']} set big = (select string_agg(md5(random()::text), '') from "
           "generate_series(1, 200)) where id = 20")
    pg.run(f"create table {t['flt']}(id int primary key, n int, b text default 'b', "
           "secret text default 'hidden')")
    pg.run(f"insert into {t['flt']}(id, n) select g, g % 20 from generate_series(1, 300) g")
    pg.run(f"create table {t['nd']}(id int primary key, n int)")
    pg.run(f"insert into {t['nd']} select g, g from generate_series(1, 50) g")
    pg.run(f"create table {t['part']}(id int primary key, n int) partition by range (id)")
    pg.run(f"create table {t['part']}_a partition of {t['part']} for values from (0) to (100)")
    pg.run(f"create table {t['part']}_b partition of {t['part']} for values from (100) to "
           "(1000)")
    pg.run(f"insert into {t['part']} select g, g from generate_series(1, 200) g")
    pg.run(f"create table {t['kl']}(a int, b text)")
    pg.run(f"alter table {t['kl']} replica identity full")
    pg.run(f"insert into {t['kl']} values (1, 'x'), (1, 'x'), (2, 'y'), (3, null)")
    pg.run(f"create publication all_{u} for table {t['big']}, {t['dmg']}, {t['nd']}, {t['kl']}")
    pg.run(f"create publication pf_{u} for table {t['flt']} (id, n, b) where (id % 3 <> 0)")
    pg.run(f"create publication pp_{u} for table {t['part']} "
           "with (publish_via_partition_root = true)")
    routes = "".join(f'[[routes]]\nname = "{r}_{u}"\ntables = ["{t["dmg"]}"]\n\n'
                     for r in DAMAGED)
    routes += f"""
[[routes]]
name = "big_{u}"
tables = ["{t['big']}"]

[[routes]]
name = "flt_{u}"
publication = "pf_{u}"

[[routes]]
name = "nd_{u}"
tables = ["{t['nd']}"]
operations = ["insert", "update"]

[[routes]]
name = "part_{u}"
publication = "pp_{u}"

[[routes]]
name = "kl_{u}"
tables = ["{t['kl']}"]
"""
    slot = f"{u}_router"
    cfg = write_config(tmp / "router.toml", dsn=pg_dsn, slot=slot,
                       publications=[f"all_{u}", f"pf_{u}", f"pp_{u}"],
                       bootstrap=kafka_bootstrap, routes=routes)
    router = Router(cfg, tmp / "router.log")
    writers = [Writer(pg_dsn, t["big"], BIG_ROWS + 500, 1), Writer(pg_dsn, t["flt"], 400, 2),
               Writer(pg_dsn, t["nd"], 60, 3)]
    try:
        wait_for("the slot", lambda: pg.run("select 1 from pg_replication_slots where "
                                            "slot_name = %s and active", slot), router.log)
        # a change whose new row keeps the TOASTed value: the record names it unchanged
        pg.run(f"update {t['dmg']} set n = n + 100 where id = 20")
        pg.run(f"update {t['part']} set n = -n where id in (5, 150)")
        pg.run(f"delete from {t['kl']} where ctid = (select min(ctid) from {t['kl']} "
               "where a = 1)")
        pg.run(f"insert into {t['kl']} values (4, 'z'), (4, 'z')")
        for w in writers:
            w.start()
        yield {"pg": pg, "u": u, "t": t, "cfg": cfg, "router": router, "writers": writers,
               "bootstrap": kafka_bootstrap, "tmp": tmp}
    finally:
        for w in writers:
            w.halt()
        router.stop()
        pg.drop_slot(slot)
        for p in ("all", "pf", "pp"):
            pg.run(f"drop publication if exists {p}_{u}")
        for name in t.values():
            pg.run(f"drop table if exists {name} cascade")
        pg.run(f"drop type if exists mood_{u}")
        topics = [f"{r}_{u}.public.{t['dmg']}" for r in DAMAGED]
        topics += [f"{r}_{u}.public.{t[r]}" for r in ("big", "flt", "nd", "part", "kl")]
        delete_topics(kafka_bootstrap, topics)
        pg.close()


def test_undamaged_topics_are_equal_while_writers_write(stack):
    """Every route equal: the table under writes (the cut at the snapshot's LSN), the
    filtered and projected route, the route without DELETE (deleted rows kept, not extra),
    the partitioned table via its root, the keyless multiset."""
    u = stack["u"]
    code, doc, err = verify(stack["cfg"])
    assert code == 0, (err, doc)
    assert doc["equal"] and all(r["equal"] for r in doc["results"])
    assert all(w.ops > 0 for w in stack["writers"])
    big = result(doc, f"big_{u}")
    assert big["compared"] > BIG_ROWS / 2 and big["matching"] == big["compared"]
    # PostgreSQL's bucket digests equal the topic's for every type of the table: no row
    # of it was read one by one
    assert big["buckets"] >= 2 and big["buckets_differing"] == 0 and big["rows_read"] == 0, big
    flt = result(doc, f"flt_{u}")
    # only rows the filter passes are compared
    pg = stack["pg"]
    assert 0 < flt["compared"] < pg.one(f"select count(*) from {stack['t']['flt']}")
    assert result(doc, f"part_{u}")["compared"] == 200
    assert result(doc, f"part_{u}")["tables"] == [f"public.{stack['t']['part']}_a",
                                                  f"public.{stack['t']['part']}_b"]
    assert result(doc, f"kl_{u}")["compared"] == 5
    nd = result(doc, f"nd_{u}")
    assert nd["kept"] > 0 and nd["extra"] == 0, nd
    assert "pgrouter_verify_missing_rows" in doc["metrics"]


def _dmg_topic(stack, route: str) -> str:
    return f"{route}_{stack['u']}.public.{stack['t']['dmg']}"


def _snapshot_record_of(records, key: int):
    return [i for i, (_, k, v, _) in enumerate(records)
            if json.loads(k) == {"id": key} and json_value(v)["op"] == "r"][0]


def test_damage_is_found_exactly(stack):
    """Four topics of one quiet table, each damaged once: verify names exactly that damage."""
    boot = stack["bootstrap"]

    def drop_record(records, key=7):
        i = _snapshot_record_of(records, key)
        return records[:i] + records[i + 1:]

    def alter(records):
        i = _snapshot_record_of(records, 5)
        p, k, v, h = records[i]
        doc = json.loads(v)
        doc["after"]["v"] = "altered"
        return records[:i] + [(p, k, json.dumps(doc).encode(), h)] + records[i + 1:]

    def extra(records):
        p, k, v, h = records[_snapshot_record_of(records, 3)]
        doc = json.loads(v)
        doc["after"]["id"] = 999
        return records + [(p, json.dumps({"id": 999}).encode(), json.dumps(doc).encode(), h)]

    def lose_toast(records):
        i = _snapshot_record_of(records, 20)
        assert len(json.loads(records[i][2])["after"]["big"]) > 6000
        return records[:i] + records[i + 1:]

    code, doc, err = verify(stack["cfg"], *[a for r in DAMAGED
                                            for a in ("--route", f"{r}_{stack['u']}")])
    assert code == 0, (err, doc)  # undamaged first
    for route, change in zip(DAMAGED, (drop_record, alter, extra, lose_toast)):
        rewrite_topic(boot, _dmg_topic(stack, route), change)
    code, doc, err = verify(stack["cfg"], *[a for r in DAMAGED
                                            for a in ("--route", f"{r}_{stack['u']}")])
    assert code == 1, (err, doc)
    got = {r["route"].rsplit("_", 2)[0]: r for r in doc["results"]}
    counts = {name: (r["missing"], r["extra"], r["different"]) for name, r in got.items()}
    assert counts == {"del": (1, 0, 0), "alt": (0, 0, 1), "extra": (0, 1, 0),
                      "toast": (0, 0, 1)}, doc
    assert got["del"]["missing_keys"] == [{"id": 7}]
    assert got["alt"]["different_keys"] == [{"key": {"id": 5}, "columns": ["v"]}]
    assert got["extra"]["extra_keys"] == [{"id": 999}]
    assert got["toast"]["different_keys"] == [{"key": {"id": 20}, "columns": ["big"]}]
    assert all(r["compared"] == 40 for r in got.values())
    # only the damaged key's bucket was read (one bucket: the table is small)
    assert all(r["buckets_differing"] == 1 for r in got.values()), got
    # in passes of at most 7 keys (bounded memory), a differing bucket of more than 2 rows
    # bisected (sub-buckets' digests computed again by PostgreSQL): the same findings, fewer
    # rows read (the damaged key's sub-bucket, and key 20's: a row carried from an earlier
    # record, unchanged TOAST, has no digest, so its bucket always differs)
    code, again, err = verify(stack["cfg"], "--max-keys", "7", "--split-rows", "2",
                              *[a for r in DAMAGED for a in ("--route", f"{r}_{stack['u']}")])
    assert code == 1, err
    for r in again["results"]:
        name = r["route"].rsplit("_", 2)[0]
        assert r["passes"] == 6 and r["compared"] == 40, r
        assert r["buckets_split"] == r["buckets_differing"] in (1, 2), json.dumps(r)
        # two sub-buckets of a few rows each (where the keys hash decides how many)
        assert r["rows_read"] <= 6, json.dumps(r)
        for field in ("missing_keys", "extra_keys", "different_keys"):
            assert r[field] == got[name][field], (name, r)


def test_filtered_route_and_keyless_table_damage(stack):
    """A row the route's filter rejects, written into its topic, is extra; a duplicate row
    added to a keyless table's topic is extra once (multiset); a partition's update left out of
    the root's topic leaves the row different."""
    u, t, boot, pg = stack["u"], stack["t"], stack["bootstrap"], stack["pg"]
    out_of_filter = pg.one(f"select id from {t['flt']} where id % 3 = 0 order by id limit 1")

    def add_filtered_out(records):
        p, k, v, h = records[-1]
        doc = json.loads(v)
        doc["op"], doc["before"] = "r", None
        doc["after"] = {"id": out_of_filter, "n": 3, "b": "b"}
        return records + [(p, json.dumps({"id": out_of_filter}).encode(),
                           json.dumps(doc).encode(), h)]

    def add_duplicate(records):
        [first] = [r for r in records if json_value(r[2])["after"] == {"a": 2, "b": "y"}]
        return records + [first]

    def drop_partition_row(records):
        i = [i for i, r in enumerate(records) if json.loads(r[1]) == {"id": 150}
             and json_value(r[2])["op"] == "u"][0]
        return records[:i] + records[i + 1:]

    stack["writers"][1].halt()  # the filtered table is rewritten: nothing may arrive meanwhile
    code, doc, err = verify(stack["cfg"], "--route", f"flt_{u}")
    assert code == 0, (err, doc)
    rewrite_topic(boot, f"flt_{u}.public.{t['flt']}", add_filtered_out)
    rewrite_topic(boot, f"kl_{u}.public.{t['kl']}", add_duplicate)
    rewrite_topic(boot, f"part_{u}.public.{t['part']}", drop_partition_row)
    code, doc, err = verify(stack["cfg"], "--route", f"flt_{u}", "--route", f"kl_{u}",
                            "--route", f"part_{u}")
    assert code == 1, (err, doc)
    flt, kl, part = (result(doc, f"{r}_{u}") for r in ("flt", "kl", "part"))
    assert (flt["missing"], flt["extra"], flt["different"]) == (0, 1, 0)
    assert flt["extra_keys"] == [{"id": out_of_filter}]
    assert (kl["missing"], kl["extra"], kl["different"]) == (0, 1, 0)
    assert kl["extra_keys"] == [{"a": 2, "b": "y"}]
    assert (part["missing"], part["extra"], part["different"]) == (0, 0, 1), part
    assert part["different_keys"] == [{"key": {"id": 150}, "columns": ["n"]}]


def test_bad_input_is_one_line(stack, tmp_path):
    u = stack["u"]
    code, _, err = verify(stack["cfg"], "--route", "nope")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--route nope" in err, err
    code, _, err = verify(stack["cfg"], "--table", "public.nope")
    assert code == 2 and "--table public.nope: no such table" in err, err
    pg = stack["pg"]
    pg.run(f"create table nk_{u}(a int)")
    pg.run(f"alter publication all_{u} add table nk_{u}")
    try:
        text = stack["cfg"].read_text() + f'\n[[routes]]\nname = "nk_{u}"\ntables = ["nk_{u}"]\n'
        cfg = tmp_path / "nk.toml"
        cfg.write_text(text)
        code, _, err = verify(cfg, "--table", f"nk_{u}")
        assert code == 2 and "no primary key" in err and len(err.strip().splitlines()) == 1, err
        bad = tmp_path / "down.toml"
        bad.write_text(text.replace(stack["bootstrap"], "127.0.0.1:1"))
        code, _, err = verify(bad, "--route", f"big_{u}", timeout=180)
        assert code == 2 and "127.0.0.1:1" in err and "Traceback" not in err, err
        dsn = text.split('dsn = "')[1].split('"')[0]
        # the server's port, whatever it is, replaced by one nothing listens on
        bad.write_text(text.replace(dsn, re.sub(r":\d+/", ":1/", dsn, count=1)))
        code, _, err = verify(bad)
        assert code == 2 and "cannot connect to PostgreSQL" in err, err
    finally:
        pg.run(f"alter publication all_{u} drop table nk_{u}")
        pg.run(f"drop table nk_{u}")
    assert os.path.exists(stack["cfg"])


def test_repair_heals_every_damage_while_writers_write(stack):
    """``verify --repair`` after the damage above: the router re-sends exactly the keys that
    differ (a delete for the extra one), while writers keep writing (also to the damaged
    table), and verify then says equal. The keyless table cannot be repaired by key: it is
    said in one line and left out here."""
    u, t = stack["u"], stack["t"]
    routes = [f"{r}_{u}" for r in (*DAMAGED, "flt", "part", "big", "nd")]
    args = [a for r in routes for a in ("--route", r)]
    code, doc, _ = verify(stack["cfg"], *args)
    assert code == 1 and sum(1 for r in doc["results"] if not r["equal"]) == 6, doc
    writer = Writer(stack["pg"].dsn, t["dmg"], 45, seed=4, low=25)
    writer.start()
    try:
        code, doc, err = verify(stack["cfg"], "--repair", *args, timeout=240)
    finally:
        writer.halt()
    assert code == 0, (err, doc)
    assert doc["equal"] and writer.ops > 0
    assert "repair requested" in err
    log = stack["router"].log.read_text()
    # the router logs each repair with its keys
    assert "repair_keys" in log and "[999]" in err
    repaired = [line for line in err.splitlines() if "repair requested" in line]
    assert len(repaired) == 7, err  # 4 damaged routes, flt, part's two partitions
    # exactly the keys that differed were sent again: the initial snapshot's 40 rows (one
    # left out by the damage) and one row more
    for route, snap in (("del", 40), ("alt", 41)):
        _, records = raw_records(stack["bootstrap"], _dmg_topic(stack, route))
        assert sum(1 for r in records if json_value(r[2])["op"] == "r") == snap, route
    _, records = raw_records(stack["bootstrap"], _dmg_topic(stack, "extra"))
    deleted = [json.loads(r[1]) for r in records if json_value(r[2])["op"] == "d"]
    assert [k for k in deleted if not 25 <= k["id"] < 45] == [{"id": 999}]  # not the writer's
