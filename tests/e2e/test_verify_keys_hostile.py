"""``pgrouter verify`` against keys a plain confluent-kafka producer writes in other spellings
than the router's (spacing, ``\\u`` escapes, a member twice, another JSON type, int64's
edges, a name that is not UTF-8), each verdict checked against a plain consumer's fold and
PostgreSQL's SELECT, with the C fold and its pure-Python twin (``PGROUTER_PURE_PYTHON=1``),
which must agree; then ``--repair``, after which verify names exactly what a consumer still
sees differ (keys the router cannot write are left, said in one line)."""

from __future__ import annotations

import json

import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.test_verify_hostile import IMPLS, _bumped, _latest, _named, _typed
from tests.e2e.verify_kit import Codec, canon, plain_fold, produce, read_topic
from tests.e2e.verify_stack import Router, result, verify, wait_for
from tests.helpers import Pg, unique, write_config

pytestmark = pytest.mark.services

ROWS = 20
ROUTES = ("keys", "badname", "parts", "vals", "badval", "badstr")
PARTITIONS = 64  # more than the rows: most partitions empty


@pytest.fixture(scope="module")
def stack(pg_dsn, kafka_bootstrap, tmp_path_factory):
    pg = Pg(pg_dsn)
    u = unique("vk")
    tmp = tmp_path_factory.mktemp(u)
    t = f"t_{u}"
    pg.run(f"create table {t}(id bigint primary key, n int, v text)")
    pg.run(f"insert into {t} select g, g, 'é' || g from generate_series(1, {ROWS}) g")
    pg.run(f"create publication p_{u} for table {t}")
    routes = "".join(f'[[routes]]\nname = "{r}_{u}"\ntables = ["{t}"]\n\n' for r in ROUTES)
    slot = f"{u}_router"
    cfg = write_config(tmp / "router.toml", dsn=pg_dsn, slot=slot, publications=[f"p_{u}"],
                       bootstrap=kafka_bootstrap, routes=routes)
    topics = {r: f"{r}_{u}.public.{t}" for r in ROUTES}
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for f in admin.create_topics([NewTopic(topics["parts"], PARTITIONS, 1)]).values():
        f.result(30)
    router = Router(cfg, tmp / "router.log")
    try:
        wait_for("the slot", lambda: pg.run("select 1 from pg_replication_slots where "
                                            "slot_name = %s and active", slot), router.log)
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


def _verdict(stack, route):
    fold = plain_fold(read_topic(stack["boot"], stack["topics"][route]), stack["codec"])
    table = {canon({"id": i}): {"id": i, "n": n, "v": v}
             for i, n, v in stack["pg"].run(f"select id, n, v from {stack['t']}")}
    return (set(table) - set(fold), set(fold) - set(table),
            {k for k in set(table) & set(fold) if _typed(table[k]) != _typed(fold[k])})


def _spelled(stack):
    """A record a key under spellings of its key: the same key for a consumer (spacing,
    escapes, a member twice: the last) with another n, and keys of another JSON type or at
    int64's edges (extra keys)."""
    topic = stack["topics"]["keys"]
    out = []
    for kb, id_ in ((b'{"id": 1}', 1), (b'{ "\\u0069d" : 2 }', 2), (b'{"id":99,"id":3}', 3),
                    (b'{"id":"4"}', 4), (b'{"id":5.0}', 5), (b'{"id":6e0}', 6),
                    (b'{"id":9223372036854775807}', 7), (b'{"id":-9223372036854775808}', 8),
                    (b'{"id":-0}', 9)):
        p, _kb, env = _latest(stack, topic, id_)
        after = dict(env["after"], id=json.loads(kb)["id"], n=env["after"]["n"] + 100)
        out.append((p, kb, json.dumps(_bumped(env, after=after)).encode()))
    produce(stack["boot"], topic, out)


def test_key_spellings_get_a_plain_consumers_verdict_in_both_folds(stack, monkeypatch):
    _spelled(stack)
    want = _verdict(stack, "keys")
    assert want[1] and want[2], want
    route = f"keys_{stack['u']}"
    for impl, pure in IMPLS.items():
        monkeypatch.setenv("PGROUTER_PURE_PYTHON", pure)
        code, doc, err = verify(stack["cfg"], "--route", route, "--examples", "100")
        assert code == 1 and doc is not None, (impl, err)
        got = result(doc, route)
        assert _named(got) == want, (impl, got, want)
    monkeypatch.setenv("PGROUTER_PURE_PYTHON", "0")
    code, doc, err = verify(stack["cfg"], "--route", route, "--repair", "--examples", "100")
    left = _verdict(stack, "keys")
    assert code in (0, 1) and doc is not None, err
    assert _named(result(doc, route)) == left, (doc, left, err)
    assert not left[0] and not left[2], left  # what the router can write is healed


def test_a_key_name_that_is_not_utf8_is_one_line_in_both_folds(stack, monkeypatch):
    topic = stack["topics"]["badname"]
    p, _kb, env = _latest(stack, topic, 10)
    produce(stack["boot"], topic, [(p, b'{"\xe9":10}', json.dumps(_bumped(env)).encode())])
    for impl, pure in IMPLS.items():
        monkeypatch.setenv("PGROUTER_PURE_PYTHON", pure)
        code, doc, err = verify(stack["cfg"], "--route", f"badname_{stack['u']}")
        line = err.strip().splitlines()[-1] if err.strip() else ""
        assert code == 2 and doc is None and topic in line and "Traceback" not in err, \
            (impl, code, err, doc)


@pytest.mark.parametrize("route, spelled", [("badval", (b'"X": 1', b'"\xff": 1')),
                                             ("badstr", (b'"db": "', b'"db": "\xe9'))])
def test_a_value_that_is_not_utf8_is_one_line_in_both_folds(stack, monkeypatch, route,
                                                             spelled):
    """A value with bytes that are not UTF-8 in a member verify skips (a name of the
    envelope, a string of its source): a consumer's JSON parser refuses the record; verify
    says exit 2 naming the topic and the key in both folds (both used to fold it: equal)."""
    topic = stack["topics"][route]
    p, kb, env = _latest(stack, topic, 10)
    body = json.dumps(_bumped(env, X=1)).encode().replace(*spelled)
    assert body != json.dumps(_bumped(env, X=1)).encode()
    with pytest.raises(ValueError):
        json.loads(body)  # what a consumer sees
    produce(stack["boot"], topic, [(p, kb, body)])
    for impl, pure in IMPLS.items():
        monkeypatch.setenv("PGROUTER_PURE_PYTHON", pure)
        code, doc, err = verify(stack["cfg"], "--route", f"{route}_{stack['u']}")
        line = err.strip().splitlines()[-1] if err.strip() else ""
        assert code == 2 and doc is None and topic in line and repr(kb) in line \
            and "not UTF-8" in line and "Traceback" not in err, (impl, code, err, doc)


def test_many_partitions_most_empty_in_both_folds(stack, monkeypatch):
    """A topic of 64 partitions and 20 keys: a tombstone in one key's partition, a newer
    record of another key in a partition that held nothing (not the key's hash's)."""
    topic = stack["topics"]["parts"]
    records = read_topic(stack["boot"], topic)
    used = {p for p, _o, _k, _v in records}
    assert len(used) < PARTITIONS
    p, kb, _env = _latest(stack, topic, 11)
    q, kb2, env = _latest(stack, topic, 12)
    empty = min(set(range(PARTITIONS)) - used)
    after = dict(env["after"], n=env["after"]["n"] + 1)
    produce(stack["boot"], topic, [(p, kb, None),
                                   (empty, kb2, json.dumps(_bumped(env, after=after)).encode())])
    want = _verdict(stack, "parts")
    assert want == ({canon({"id": 11})}, set(), {canon({"id": 12})}), want
    route = f"parts_{stack['u']}"
    for impl, pure in IMPLS.items():
        monkeypatch.setenv("PGROUTER_PURE_PYTHON", pure)
        code, doc, err = verify(stack["cfg"], "--route", route)
        assert code == 1 and doc is not None and _named(result(doc, route)) == want, \
            (impl, err, doc)
    monkeypatch.setenv("PGROUTER_PURE_PYTHON", "0")
    code, doc, err = verify(stack["cfg"], "--route", route, "--repair")
    assert code == 0 and doc["equal"], (err, doc)
    assert not any(_verdict(stack, "parts"))


def test_values_at_type_edges_in_both_folds(stack, monkeypatch):
    """n at int32's edges and 0 written as another JSON type or spelling: a float (1e0,
    2147483647.0), a string, -0 (an int 0 for a consumer: equal), an int past int64."""
    pg, t, topic = stack["pg"], stack["t"], stack["topics"]["vals"]
    pg.run(f"update {t} set n = 2147483647 where id = 14")
    pg.run(f"update {t} set n = -2147483648 where id = 15")
    pg.run(f"update {t} set n = 0 where id in (16, 17)")
    wait_for("the updates", lambda: _latest(stack, topic, 17)[2]["after"]["n"] == 0, None)
    out = []
    for id_, text in ((14, "2147483647.0"), (15, '"-2147483648"'), (16, "-0"), (17, "0e0"),
                      (18, "18446744073709551616"), (19, "1E0")):
        p, kb, env = _latest(stack, topic, id_)
        body = json.dumps(_bumped(env, after=dict(env["after"], n="N"))).replace('"N"', text)
        out.append((p, kb, body.encode()))
    produce(stack["boot"], topic, out)
    want = _verdict(stack, "vals")
    assert want[2] == {canon({"id": i}) for i in (14, 15, 17, 18, 19)}, want
    route = f"vals_{stack['u']}"
    for impl, pure in IMPLS.items():
        monkeypatch.setenv("PGROUTER_PURE_PYTHON", pure)
        code, doc, err = verify(stack["cfg"], "--route", route, "--examples", "100")
        assert code == 1 and doc is not None and _named(result(doc, route)) == want, \
            (impl, err, doc)
    monkeypatch.setenv("PGROUTER_PURE_PYTHON", "0")
    code, doc, err = verify(stack["cfg"], "--route", route, "--repair")
    assert code == 0 and doc["equal"], (err, doc)
    assert not any(_verdict(stack, "vals"))
