"""A differential test of ``pgrouter verify``: random damage, drawn from a seeded generator, is
written with a plain confluent-kafka producer to the topics of several tables (a composite
key, a route with a row filter and a column list, TOASTed values carried by unchanged-TOAST
updates, NULLs, ints, floats, booleans, text), and partitions lose their oldest records. The
expected verdict is computed here, not by verify's code: each topic folded by a plain
consumer (``tests/e2e/verify_kit.plain_fold``) against PostgreSQL's SELECT of what the route
takes. Verify must name exactly those keys; after ``--repair`` the fold equals the table.

CI runs ``CASES`` cases of seed ``SEED``; ``VERIFY_DIFF_CASES`` and ``VERIFY_DIFF_SEED`` run
more (or others) locally.
"""

from __future__ import annotations

import json
import os
import random

import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.verify_kit import Codec, canon, plain_fold, produce, read_topic
from tests.e2e.verify_stack import Router, result, verify, wait_for
from tests.helpers import Pg, unique, write_config

pytestmark = pytest.mark.services

SEED = int(os.environ.get("VERIFY_DIFF_SEED", "51"))
CASES = int(os.environ.get("VERIFY_DIFF_CASES", "4"))
ROWS = 60


class Stack:
    """Three routes: ``a`` (one key, TOAST, floats, NULLs), ``b`` (a composite key), ``c``
    (a ``where`` and a column list)."""

    def __init__(self, pg_dsn, boot, tmp):
        self.pg, self.boot, self.u = Pg(pg_dsn), boot, unique("vdiff")
        u = self.u
        self.tables = {"a": f"a_{u}", "b": f"b_{u}", "c": f"c_{u}"}
        a, b, c = self.tables.values()
        pg = self.pg
        pg.run(f"create table {a}(id int primary key, n int, ok bool, f float8, v text, big text)")
        pg.run(f"insert into {a} select g, g, case when g % 4 = 0 then null else g % 2 = 0 end, "
               f"g / 8.0, case when g % 5 = 0 then null else 'v' || g end, case when g % 6 = 0 "
               "then (select string_agg(md5(g::text || i), '') from generate_series(1, 150) i) "
               f"end from generate_series(1, {ROWS}) g")
        pg.run(f"create table {b}(x int, y text, n int, primary key (x, y))")
        pg.run(f"insert into {b} select g % 7, 'y' || g, g from generate_series(1, {ROWS}) g")
        pg.run(f"create table {c}(id int primary key, n int, secret text, v text)")
        pg.run(f"insert into {c} select g, g, 's' || g, 'v' || g from generate_series(1, {ROWS}) g")
        pg.run(f"create publication p_{u} for table {a}, {b}, {c}")
        routes = (f'[[routes]]\nname = "a_{u}"\ntables = ["{a}"]\n\n'
                  f'[[routes]]\nname = "b_{u}"\ntables = ["{b}"]\n\n'
                  f'[[routes]]\nname = "c_{u}"\ntables = ["{c}"]\nwhere = "n % 3 <> 0"\n'
                  'columns = ["id", "n", "v"]\n')
        self.slot = f"{u}_router"
        self.cfg = write_config(tmp / "router.toml", dsn=pg_dsn, slot=self.slot,
                                publications=[f"p_{u}"], bootstrap=boot, routes=routes)
        self.topics = {r: f"{r}_{u}.public.{t}" for r, t in self.tables.items()}
        self.router = Router(self.cfg, tmp / "router.log")
        self.codec = Codec("json")

    def close(self) -> None:
        self.router.stop()
        self.pg.drop_slot(self.slot)
        self.pg.run(f"drop publication if exists p_{self.u}")
        self.pg.run(f"drop table if exists {', '.join(self.tables.values())}")
        delete_topics(self.boot, list(self.topics.values()))
        self.pg.close()

    def table(self, r: str) -> dict[str, dict]:
        """What route ``r`` takes of its table, by SELECT, keyed as its records are."""
        t = self.tables[r]
        if r == "a":
            cols = ("id", "n", "ok", "f", "v", "big")
            rows = self.pg.run(f"select {', '.join(cols)} from {t}")
            return {canon({"id": row[0]}): dict(zip(cols, row)) for row in rows}
        if r == "b":
            rows = self.pg.run(f"select x, y, n from {t}")
            return {canon({"x": x, "y": y}): {"x": x, "y": y, "n": n} for x, y, n in rows}
        rows = self.pg.run(f"select id, n, v from {t} where n % 3 <> 0")
        return {canon({"id": i}): {"id": i, "n": n, "v": v} for i, n, v in rows}

    def folded(self, r: str) -> tuple[list, dict[str, dict]]:
        records = read_topic(self.boot, self.topics[r])
        return records, plain_fold(records, self.codec)


def _expected(table: dict, fold: dict) -> dict[str, set]:
    return {"missing": set(table) - set(fold), "extra": set(fold) - set(table),
            "different": {k for k in set(table) & set(fold) if table[k] != fold[k]}}


def _named(r: dict) -> dict[str, set]:
    return {"missing": {canon(k) for k in r["missing_keys"]},
            "extra": {canon(k) for k in r["extra_keys"]},
            "different": {canon(d["key"]) for d in r["different_keys"]}}


def _value(rng: random.Random, col: str):
    """A value for ``col``, sometimes of another JSON type than the column's."""
    pick = rng.random()
    if pick < 0.2:
        return None
    if pick < 0.4:  # another JSON type
        return rng.choice(["24", "true", 1.5, 7, False, "v3"])
    if col in ("n", "id", "x"):
        return rng.randrange(-5, 200)
    if col == "ok":
        return rng.random() < 0.5
    if col == "f":
        return rng.choice([0.125, 1.0, -2.5, 1e300])
    return rng.choice(["v1", "", "x\ty", "é", "v" + str(rng.randrange(100))])


def _damage(rng: random.Random, stack: Stack, r: str, records: list) -> list[tuple]:
    """One to five random damages of route ``r``'s topic: (partition, key, value) records."""
    latest: dict[str, tuple] = {}
    for p, _o, kb, vb in records:
        env = json.loads(vb) if vb else None
        if kb is None or not env or env.get("op") not in ("c", "r", "u", "d"):
            continue
        pos = (env["source"]["commit_lsn"], env["source"]["seq"])
        k = canon(json.loads(kb))
        if k not in latest or pos > latest[k][0]:
            latest[k] = (pos, p, kb, env)
    keys = sorted(latest)
    out = []
    for _ in range(rng.randrange(1, 6)):
        pos, p, kb, env = latest[rng.choice(keys)]
        src = dict(env["source"], seq=pos[1] + rng.randrange(1, 4))
        row = dict(env.get("after") or env.get("before") or {})
        kind = rng.choice(["delete", "alter", "alter", "extra", "old", "again", "toast",
                           "rekey", "truncated"] + (["filtered"] if r == "c" else []))
        if kind == "delete":
            out.append((p, kb, dict(env, op="d", before=json.loads(kb), after=None, source=src)))
        elif kind == "alter" and row:
            col = rng.choice(sorted(set(row) - set(json.loads(kb))) or sorted(row))
            out.append((p, kb, dict(env, op="u", after=dict(row, **{col: _value(rng, col)}),
                                    source=src)))
        elif kind in ("extra", "filtered", "rekey") and row:
            key = json.loads(kb)
            col = next(iter(key)) if r != "b" else rng.choice(sorted(key))
            key[col] = (rng.randrange(1, ROWS) * 3 if kind == "filtered" and r == "c"
                        else rng.randrange(1000, 2000) if col != "y" else f"z{rng.random()}")
            after = dict(row, **key)
            if kind == "filtered":  # a row the table holds, which the route's where rejects
                after = {"id": key["id"], "n": key["id"], "v": f"v{key['id']}"}
            before = json.loads(kb) if kind == "rekey" else None
            out.append((p, json.dumps(key).encode(),
                        dict(env, op="u" if before else "c", before=before, after=after,
                             source=src)))
        elif kind == "old":  # older than what the key holds: changes nothing
            old = dict(env["source"], commit_lsn=max(1, pos[0] - 1))
            out.append((p, kb, dict(env, op="u", after=dict(row, n=-1), source=old)))
        elif kind == "again":  # written twice: changes nothing
            out.append((p, kb, env))
        elif kind == "toast" and r == "a" and row:
            after = {c: v for c, v in row.items() if c != "big"}
            out.append((p, kb, dict(env, op="u", after=after, unchanged_toast=["big"],
                                    source=src)))
        elif kind == "truncated":
            _delete_oldest(stack, r, records, rng)
    return [(p, kb, json.dumps(v).encode()) for p, kb, v in out]


def _delete_oldest(stack: Stack, r: str, records: list, rng: random.Random) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    p = rng.choice(sorted({rec[0] for rec in records}))
    offsets = sorted(o for q, o, _k, _v in records if q == p)
    upto = offsets[min(len(offsets) - 1, rng.randrange(1, 15))]
    admin = AdminClient({"bootstrap.servers": stack.boot})
    [done] = admin.delete_records([TopicPartition(stack.topics[r], p, upto)]).values()
    done.result(30)


@pytest.fixture(scope="module")
def stack(pg_dsn, kafka_bootstrap, tmp_path_factory):
    s = Stack(pg_dsn, kafka_bootstrap, tmp_path_factory.mktemp("vdiff"))
    try:
        wait_for("the slot", lambda: s.pg.run("select 1 from pg_replication_slots where "
                                              "slot_name = %s and active", s.slot), s.router.log)
        # updates that leave TOASTed values unchanged: records carrying unchanged_toast
        s.pg.run(f"update {s.tables['a']} set n = n + 1000 where id % 3 = 0")
        # delivered before the first verify (late in a loaded suite the topics could still
        # be without a leader when verify asked for them: "does not exist")
        lsn = s.pg.one("select pg_current_wal_lsn()::text")
        wait_for("the router to deliver", lambda: s.pg.one(
            "select confirmed_flush_lsn >= %s::pg_lsn from pg_replication_slots where "
            "slot_name = %s", lsn, s.slot), s.router.log)
        code, doc, err = verify(s.cfg)
        assert code == 0 and doc["equal"], err
        yield s
    finally:
        s.close()


@pytest.mark.parametrize("case", range(CASES))
def test_verify_names_exactly_what_a_plain_consumer_sees_differ(stack, case):
    rng = random.Random(SEED * 1000 + case)
    damaged = rng.sample(sorted(stack.tables), rng.randrange(1, 4))
    for r in damaged:
        records, _ = stack.folded(r)
        produce(stack.boot, stack.topics[r], _damage(rng, stack, r, records))
    want = {r: _expected(stack.table(r), stack.folded(r)[1]) for r in stack.tables}
    code, doc, err = verify(stack.cfg, "--examples", "1000")
    assert doc is not None, err
    for r in stack.tables:
        got = result(doc, f"{r}_{stack.u}")
        assert _named(got) == want[r], (case, r, err, got)
        assert (got["missing"], got["extra"], got["different"]) == tuple(
            len(want[r][k]) for k in ("missing", "extra", "different")), (case, r, got)
    assert code == (0 if not any(any(w.values()) for w in want.values()) else 1), (err, doc)
    code, doc, err = verify(stack.cfg, "--repair")
    assert code == 0 and doc["equal"], (case, err, doc)
    for r in stack.tables:
        assert stack.folded(r)[1] == stack.table(r), (case, r)
