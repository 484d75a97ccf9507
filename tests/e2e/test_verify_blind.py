"""``pgrouter verify`` never says "equal" when a consumer would see something else, and
``--repair`` heals what it names (or says what it cannot heal and what to do), in the JSON,
Kafka Connect and Avro formats: damage is written with a plain confluent-kafka producer and
the topics are read back by a plain consumer (``tests/e2e/verify_kit.py``: ``json``,
``fastavro`` with the registry's schemas), compared with PostgreSQL's own SELECT.

* a record verify cannot read (bytes that are not JSON, an Avro-looking record on a JSON
  route) is one line naming the topic and the key (exit 2);
* a value of another JSON type (``"24"`` for 24, ``"true"`` for true) is a difference;
* a record positioned past the source's WAL end is named;
* extra keys whose rows the route's ``where`` rejects are deleted by the repair; extra keys
  of another key shape are named with what to do; a partition whose oldest records were
  deleted is compared as a consumer reading from the start reads it, and repaired.
"""

from __future__ import annotations

import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.verify_kit import Codec, canon, plain_fold, produce, read_topic
from tests.e2e.verify_stack import Router, result, verify, wait_for
from tests.helpers import Pg, unique, write_config

pytestmark = pytest.mark.services

ROWS = 120
ROUTES = ("types", "junk", "beyond", "filter", "shape", "trunc")


@pytest.fixture(scope="module", params=["json", "connect", "avro"])
def stack(request, pg_dsn, kafka_bootstrap, registry_url, tmp_path_factory):
    fmt = request.param
    pg = Pg(pg_dsn)
    u = unique(f"vb{fmt[0]}")
    tmp = tmp_path_factory.mktemp(u)
    t, k = f"t_{u}", f"k_{u}"
    pg.run(f"create table {t}(id int primary key, n int, ok bool, v text)")
    pg.run(f"insert into {t} select g, g, g % 3 = 0, 'v' || g from generate_series(1, {ROWS}) g")
    pg.run(f"create table {k}(a int, b text, n int, primary key (a, b))")
    pg.run(f"insert into {k} select g, 'b' || g, g from generate_series(1, 40) g")
    pg.run(f"create publication p_{u} for table {t}, {k}")
    routes = "".join(f'[[routes]]\nname = "{r}_{u}"\ntables = ["{k if r == "shape" else t}"]\n'
                     + ('where = "n % 2 = 0"\n' if r == "filter" else "") + "\n"
                     for r in ROUTES)
    kafka = f'format = "{fmt}"\n'
    if fmt == "avro":
        kafka += f'\n[kafka.registry]\nurl = "{registry_url}"\n'
    slot = f"{u}_router"
    cfg = write_config(tmp / "router.toml", dsn=pg_dsn, slot=slot, publications=[f"p_{u}"],
                       bootstrap=kafka_bootstrap, routes=routes, kafka_extra=kafka)
    topics = {r: f"{r}_{u}.public.{k if r == 'shape' else t}" for r in ROUTES}
    router = Router(cfg, tmp / "router.log")
    try:
        wait_for("the slot", lambda: pg.run("select 1 from pg_replication_slots where "
                                            "slot_name = %s and active", slot), router.log)
        code, doc, err = verify(cfg)  # waits for the initial snapshot's records
        assert code == 0 and doc["equal"], err
        yield {"pg": pg, "u": u, "cfg": cfg, "topics": topics, "fmt": fmt, "t": t, "k": k,
               "boot": kafka_bootstrap, "codec": Codec(fmt, registry_url)}
    finally:
        router.stop()
        pg.drop_slot(slot)
        pg.run(f"drop publication if exists p_{u}")
        pg.run(f"drop table if exists {t}, {k}")
        delete_topics(kafka_bootstrap, list(topics.values()))
        pg.close()


def _latest(stack, topic: str, key: dict):
    """The latest record of ``key`` in ``topic``: (partition, key bytes, value bytes, env)."""
    codec, best = stack["codec"], None
    for p, _o, kb, vb in read_topic(stack["boot"], topic):
        if kb is not None and codec.key(kb) == key:
            env = codec.value(vb)
            pos = (env["source"]["commit_lsn"], env["source"]["seq"])
            if best is None or pos > best[0]:
                best = (pos, (p, kb, vb, env))
    assert best is not None, key
    return best[1]


def _bumped(env: dict, **after) -> dict:
    """``env`` as an update one seq later with ``after`` changed."""
    src = dict(env["source"], seq=env["source"]["seq"] + 1)
    return dict(env, op="u", after=dict(env["after"], **after), source=src)


def _table(stack, table: str, where: str = "true") -> dict[str, dict]:
    pg, cols = stack["pg"], ("id", "n", "ok", "v")
    return {canon({"id": r[0]}): dict(zip(cols, r))
            for r in pg.run(f"select id, n, ok, v from {table} where {where}")}


def test_a_record_verify_cannot_read_is_one_line_naming_topic_and_key(stack):
    u, topic = stack["u"], stack["topics"]["junk"]
    p, kb, _vb, _env = _latest(stack, topic, {"id": 5})
    produce(stack["boot"], topic, [(p, kb, b"\xff\xfe not json at all")])
    code, doc, err = verify(stack["cfg"], "--route", f"junk_{u}")
    lines = err.strip().splitlines()
    assert code == 2 and doc is None and "Traceback" not in err, err
    assert topic in lines[-1] and repr(kb)[2:-1][:40] in lines[-1], err
    if stack["fmt"] != "avro":  # a record that looks like Avro on a JSON route
        produce(stack["boot"], topic, [(p, kb, b"\x00\x00\x00\x00\x07 not avro")])
        code, doc, err = verify(stack["cfg"], "--route", f"junk_{u}")
        line = err.strip().splitlines()[-1]
        assert code == 2 and topic in line and "configuration error" not in line, err


def test_a_value_of_another_json_type_is_a_difference_and_repaired(stack):
    u, topic, codec, fmt = stack["u"], stack["topics"]["types"], stack["codec"], stack["fmt"]
    damage = []
    for key, col, value in (({"id": 24}, "n", "24"), ({"id": 30}, "ok", "true")):
        p, kb, vb, env = _latest(stack, topic, key)
        env = _bumped(env, **{col: value})
        damage.append((p, kb, codec.encode_retyped(vb, env, col, "string") if fmt == "avro"
                       else codec.encode_like(vb, env)))
    produce(stack["boot"], topic, damage)
    for args in ((), ("--split-rows", "1")):
        code, doc, err = verify(stack["cfg"], "--route", f"types_{u}", *args)
        r = result(doc, f"types_{u}")
        assert code == 1 and r["different"] == 2, (err, r)
        assert sorted(map(canon, (d["key"] for d in r["different_keys"]))) == \
            [canon({"id": 24}), canon({"id": 30})], r
    code, doc, err = verify(stack["cfg"], "--route", f"types_{u}", "--repair")
    assert code == 0 and doc["equal"], (err, doc)
    assert plain_fold(read_topic(stack["boot"], topic), codec) == _table(stack, stack["t"])


def test_a_record_past_the_wal_end_is_named(stack):
    u, topic, codec = stack["u"], stack["topics"]["beyond"], stack["codec"]
    p, kb, vb, env = _latest(stack, topic, {"id": 7})
    [(end,)] = stack["pg"].run("select pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
    far = dict(env, source=dict(env["source"], commit_lsn=int(end) + (1 << 40)))
    produce(stack["boot"], topic, [(p, kb, codec.encode_like(vb, far))])
    code, doc, err = verify(stack["cfg"], "--route", f"beyond_{u}")
    r = result(doc, f"beyond_{u}")
    assert code == 1 and not doc["equal"] and r["beyond"] == 1, (err, r)
    assert r["beyond_keys"][0]["key"] == {"id": 7}, r
    code, doc, err = verify(stack["cfg"], "--route", f"beyond_{u}", "--repair")
    assert code == 1 and "past the source's WAL end" in err and "pgrouter snapshot" in err, err


def test_extra_keys_the_routes_filter_rejects_are_deleted_by_the_repair(stack):
    u, topic, codec = stack["u"], stack["topics"]["filter"], stack["codec"]
    p, kb, vb, env = _latest(stack, topic, {"id": 2})
    damage = []
    for i in range(1, 21, 2):  # rows the table holds, odd n: the route's where rejects them
        row = {"id": i, "n": i, "ok": i % 3 == 0, "v": f"v{i}"}
        damage.append((p, codec.encode_key_like(kb, {"id": i}),
                       codec.encode_like(vb, dict(env, after=row))))
    produce(stack["boot"], topic, damage)
    code, doc, err = verify(stack["cfg"], "--route", f"filter_{u}")
    r = result(doc, f"filter_{u}")
    assert code == 1 and r["extra"] == 10, (err, r)
    code, doc, err = verify(stack["cfg"], "--route", f"filter_{u}", "--repair")
    assert code == 0 and doc["equal"], (err, doc)
    assert plain_fold(read_topic(stack["boot"], topic), codec) == \
        _table(stack, stack["t"], "n % 2 = 0")


def test_extra_keys_of_another_shape_are_named_with_what_to_do(stack):
    if stack["fmt"] == "avro":
        pytest.skip("a key of another shape needs a key schema of its own: json and connect")
    u, topic, codec = stack["u"], stack["topics"]["shape"], stack["codec"]
    p, kb, vb, env = _latest(stack, topic, {"a": 5, "b": "b5"})
    foreign = b'{"id":5}' if stack["fmt"] == "json" else \
        b'{"schema":{"type":"struct","fields":[{"field":"id","type":"int32"}]},' \
        b'"payload":{"id":5}}'
    produce(stack["boot"], topic, [(p, foreign, codec.encode_like(vb, env))])
    code, doc, err = verify(stack["cfg"], "--route", f"shape_{u}", "--repair")
    assert code == 1 and "the router cannot write" in err and '{"id":5}' in err, err
    assert "pgrouter snapshot" in err, err


def test_a_partition_without_its_oldest_records_is_compared_and_repaired(stack):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    u, topic, codec = stack["u"], stack["topics"]["trunc"], stack["codec"]
    admin = AdminClient({"bootstrap.servers": stack["boot"]})
    [done] = admin.delete_records([TopicPartition(topic, 0, 30)]).values()
    assert done.result(30).low_watermark == 30
    code, doc, err = verify(stack["cfg"], "--route", f"trunc_{u}")
    r = result(doc, f"trunc_{u}")
    assert code == 1 and r["missing"] == 30 and r["extra"] == r["different"] == 0, (err, r)
    assert any("starts at offset 30" in n for n in r["notes"]), r
    code, doc, err = verify(stack["cfg"], "--route", f"trunc_{u}", "--repair")
    assert code == 0 and doc["equal"], (err, doc)
    assert plain_fold(read_topic(stack["boot"], topic), codec) == _table(stack, stack["t"])
