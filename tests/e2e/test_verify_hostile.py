"""``pgrouter verify`` against hostile records written by a plain confluent-kafka producer on
a JSON route, each verdict checked against what a plain consumer folds (``verify_kit``) and
PostgreSQL's SELECT; run with the C accelerator and its pure-Python twin
(``PGROUTER_PURE_PYTHON=1``), which must agree.

* a tombstone under a key whose row exists loses the row for a compacted topic's consumer:
  missing, and repaired; a route's own tombstones after its deletes are equal;
* duplicated JSON members: a consumer keeps the last;
* ``"\\u00e9"`` and ``"é"`` are one string; ``1.0`` in an int column is another JSON type;
* an update without ``after``, another table's record under the route's key;
* a keyed route's change record without a key, bytes after the JSON, a BOM, NaN: unreadable
  (exit 2, one line naming the topic and the key);
* transaction metadata and changed headers change nothing.

All the damages are verified in one run per implementation (a verify is a process start and a
wait for the router), then repaired in one run.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.verify_kit import Codec, canon, plain_fold, produce, read_topic
from tests.e2e.verify_stack import Router, result, verify, wait_for
from tests.helpers import Pg, unique, write_config

pytestmark = pytest.mark.services

ROWS = 30
JUNK = ("trailing", "bom", "nan")
ROUTES = ("tomb", "own", "dup", "esc", "num", "noafter", "other", "meta",
          "nullkey") + JUNK


@pytest.fixture(scope="module")
def stack(pg_dsn, kafka_bootstrap, tmp_path_factory):
    pg = Pg(pg_dsn)
    u = unique("vh")
    tmp = tmp_path_factory.mktemp(u)
    t = f"t_{u}"
    pg.run(f"create table {t}(id int primary key, n int, v text)")
    pg.run(f"insert into {t} select g, g, 'é' || g from generate_series(1, {ROWS}) g")
    pg.run(f"create publication p_{u} for table {t}")
    routes = "".join(f'[[routes]]\nname = "{r}_{u}"\ntables = ["{t}"]\n'
                     + ("tombstones = true\n" if r == "own" else "") + "\n" for r in ROUTES)
    slot = f"{u}_router"
    cfg = write_config(tmp / "router.toml", dsn=pg_dsn, slot=slot, publications=[f"p_{u}"],
                       bootstrap=kafka_bootstrap, routes=routes)
    topics = {r: f"{r}_{u}.public.{t}" for r in ROUTES}
    router = Router(cfg, tmp / "router.log")
    try:
        wait_for("the slot", lambda: pg.run("select 1 from pg_replication_slots where "
                                            "slot_name = %s and active", slot), router.log)
        pg.run(f"delete from {t} where id = {ROWS}")  # the own route writes its tombstone
        pg.run(f"insert into {t} values ({ROWS + 1}, 0, 'x')")
        code, doc, err = verify(cfg)
        assert code == 0 and doc["equal"], err
        yield {"pg": pg, "u": u, "cfg": cfg, "topics": topics, "t": t,
               "boot": kafka_bootstrap, "codec": Codec("json")}
    finally:
        router.stop()
        pg.drop_slot(slot)
        pg.run(f"drop publication if exists p_{u}")
        pg.run(f"drop table if exists {t}")
        delete_topics(kafka_bootstrap, list(topics.values()))
        pg.close()


IMPLS = {"native": "0", "pure": "1"}  # PGROUTER_PURE_PYTHON: the C fold and its twin


def _latest(stack, topic, id_):
    best = None
    for p, _o, kb, vb in read_topic(stack["boot"], topic):
        try:
            env = json.loads(vb) if kb is not None and json.loads(kb) == {"id": id_} else None
        except (TypeError, ValueError):  # a damage written before
            continue
        if isinstance(env, dict) and "source" in env:
            pos = (env["source"]["commit_lsn"], env["source"]["seq"])
            if best is None or pos > best[0]:
                best = (pos, (p, kb, env))
    return best[1]


def _bumped(env, **changes):
    return {**env, "op": "u", "source": dict(env["source"], seq=env["source"]["seq"] + 1),
            **changes}


def _table(stack):
    return {canon({"id": i}): {"id": i, "n": n, "v": v}
            for i, n, v in stack["pg"].run(f"select id, n, v from {stack['t']}")}


def _verdict(stack, route):
    """(missing, extra, different) key sets by a plain consumer's fold against SELECT."""
    fold, table = plain_fold(read_topic(stack["boot"], stack["topics"][route]),
                             stack["codec"]), _table(stack)
    return (set(table) - set(fold), set(fold) - set(table),
            {k for k in set(table) & set(fold) if _typed(table[k]) != _typed(fold[k])})


def _typed(row: dict) -> dict:
    """A row's values with their types: a consumer sees 7.0 as a float (JSON's number 7.0
    is one in Python, JavaScript aside), which the column's int is not."""
    return {c: (type(v).__name__, v) for c, v in row.items()}


def _named(r):
    return ({canon(k) for k in r["missing_keys"]}, {canon(k) for k in r["extra_keys"]},
            {canon(d["key"]) for d in r["different_keys"]})


def _produce(stack, route, records):
    produce(stack["boot"], stack["topics"][route], records)


def _damage(stack) -> None:
    """One damage a route (``own`` and ``esc`` and ``meta``: none a consumer sees)."""
    from confluent_kafka import Producer

    p, kb, _env = _latest(stack, stack["topics"]["tomb"], 3)
    _produce(stack, "tomb", [(p, kb, None)])  # a compacted topic's consumer loses id 3
    for id_, first, last in ((4, 4, 999), (5, 999, 5)):  # a consumer keeps the last member
        p, kb, env = _latest(stack, stack["topics"]["dup"], id_)
        after = json.dumps(env["after"])[:-1] + f', "n": {first}, "n": {last}}}'
        body = json.dumps(_bumped(env, after="AFTER")).replace('"AFTER"', after)
        assert json.loads(body)["after"]["n"] == last
        _produce(stack, "dup", [(p, kb, body.encode())])
    p, kb, env = _latest(stack, stack["topics"]["esc"], 6)
    body = json.dumps(_bumped(env), ensure_ascii=True)  # "\u00e96" for "é6"
    assert "\\u00e9" in body
    _produce(stack, "esc", [(p, kb, body.encode()),  # and an escaped key: {"\u0069d": 6}
                            (p, b'{"\\u0069d":6}', json.dumps(_bumped(env)).encode())])
    p, kb, env = _latest(stack, stack["topics"]["num"], 7)
    body = json.dumps(_bumped(env)).replace('"n": 7', '"n": 7.0')
    assert json.loads(body)["after"]["n"] == 7.0
    _produce(stack, "num", [(p, kb, body.encode())])
    p, kb, env = _latest(stack, stack["topics"]["noafter"], 8)
    _produce(stack, "noafter", [(p, kb, json.dumps({k: v for k, v in _bumped(env).items()
                                                   if k != "after"}).encode())])
    p, kb, env = _latest(stack, stack["topics"]["other"], 9)
    src = dict(env["source"], table="elsewhere", seq=env["source"]["seq"] + 1)
    _produce(stack, "other", [(p, kb, json.dumps(dict(env, op="u", source=src, after={
        "id": 9, "w": "another table"})).encode())])
    p, kb, env = _latest(stack, stack["topics"]["meta"], 12)
    prod = Producer({"bootstrap.servers": stack["boot"]})
    prod.produce(stack["topics"]["meta"], key=kb, partition=p, value=json.dumps(
        {"status": "END", "id": "1:2", "event_count": 1, "data_collections": []}).encode())
    prod.produce(stack["topics"]["meta"], key=kb, partition=p, value=json.dumps(env).encode(),
                 headers=[("pgrouter.lsn", b"garbage")])
    assert prod.flush(30) == 0
    p, kb, env = _latest(stack, stack["topics"]["nullkey"], 13)
    _produce(stack, "nullkey", [(p, None, json.dumps(_bumped(
        env, op="c", after={"id": 1000, "n": 1, "v": "x"})).encode())])


DIFFER = ("tomb", "dup", "num", "noafter", "other")  # what a plain consumer sees differ
EQUAL = ("own", "esc", "meta")


def test_hostile_records_get_a_plain_consumers_verdict_and_are_repaired(stack, monkeypatch):
    _damage(stack)
    want = {r: _verdict(stack, r) for r in DIFFER + EQUAL}
    assert all(any(want[r]) for r in DIFFER) and not any(any(want[r]) for r in EQUAL), want
    routes = [a for r in DIFFER + EQUAL + ("nullkey",) for a in ("--route", f"{r}_{stack['u']}")]
    for impl, pure in IMPLS.items():
        monkeypatch.setenv("PGROUTER_PURE_PYTHON", pure)
        code, doc, err = verify(stack["cfg"], *routes, "--examples", "100")
        assert code == 1 and doc is not None, (impl, err)
        for r in DIFFER + EQUAL:
            got = result(doc, f"{r}_{stack['u']}")
            assert _named(got) == want[r] and got["equal"] == (r in EQUAL), (impl, r, got, want)
        got = result(doc, f"nullkey_{stack['u']}")  # no key: an extra row, by its values
        assert got["extra"] == 1 and got["extra_keys"] == [{"id": 1000, "n": 1, "v": "x"}], \
            (impl, got)
    monkeypatch.setenv("PGROUTER_PURE_PYTHON", "0")
    routes = [a for r in DIFFER for a in ("--route", f"{r}_{stack['u']}")]
    code, doc, err = verify(stack["cfg"], *routes, "--repair")
    assert code == 0 and doc["equal"], (err, doc)
    assert not any(any(_verdict(stack, r)) for r in DIFFER)


@pytest.mark.parametrize("damage", JUNK)
def test_unreadable_records_are_one_line_naming_topic_and_key(stack, monkeypatch, damage):
    topic = stack["topics"][damage]
    p, kb, env = _latest(stack, topic, 10)
    body = json.dumps(_bumped(env, after=dict(env["after"], n=11)))
    value = {"trailing": body.encode() + b' {"x":1}', "bom": b"\xef\xbb\xbf" + body.encode(),
             "nan": body.replace('"n": 11', '"n": NaN').encode()}[damage]
    _produce(stack, damage, [(p, kb, value)])
    for impl, pure in IMPLS.items():
        monkeypatch.setenv("PGROUTER_PURE_PYTHON", pure)
        code, doc, err = verify(stack["cfg"], "--route", f"{damage}_{stack['u']}")
        line = err.strip().splitlines()[-1] if err.strip() else ""
        assert code == 2 and doc is None and topic in line and str(kb)[2:-1] in line \
            and "Traceback" not in err, (impl, damage, code, err, doc)
