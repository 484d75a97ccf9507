"""Column transforms of a route (``[[routes.transforms]]``) against PostgreSQL's own values:
every hashed value, in the initial snapshot and in the stream, equals
``encode(sha256(convert_to(salt || value::text, 'UTF8')), 'hex')`` computed by PostgreSQL;
masks and truncations as documented; the row filter sees PostgreSQL's values; the Avro
schema types a hashed int as a string; the salt appears nowhere: not in the router's log, the
topics, the schema topic, the registry, ``/api/status`` or ``pgrouter check``'s output.
``pgrouter check`` refuses a transformed key column without ``transform_keys``."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from tests.e2e.console_browser import TOKEN, free_port, http, stop, wait_for
from tests.e2e.guarantee import delete_topics
from tests.e2e.sources import drop_made, new_table, source_config
from tests.e2e.test_avro_format import avro_kafka, registry_client, registry_get
from tests.e2e.test_exactly_once import read_committed
from tests.e2e.verify_stack import verify
from tests.helpers import ROOT, run_router, start_router

pytestmark = pytest.mark.services

SALT_ENV = "PGROUTER_TEST_HASH_SALT"


def _routes(name, topic, transforms):
    return (f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\ntopic = "{topic}"\n'
            f'where = "age > 5"\n{transforms}')


TRANSFORMS = f'''
[[routes.transforms]]
kind = "hash"
columns = ["age", "email"]
salt_env = "{SALT_ENV}"

[[routes.transforms]]
kind = "mask"
columns = ["name"]
chars = 4

[[routes.transforms]]
kind = "truncate"
columns = ["note"]
chars = 3
'''


def test_transforms_equal_postgresqls_own_hashes(pg_dsn, kafka_bootstrap, registry_url,
                                                tmp_path, monkeypatch):
    salt = f"s4lt-{uuid.uuid4().hex}-é"
    monkeypatch.setenv(SALT_ENV, salt)  # the routers and check started below inherit it
    pg, name = new_table(pg_dsn, "xform", "id int primary key, age int, email text, name text, "
                         "note text")
    topic, schemas = f"{name}.t", f"{name}.schemas"
    pg.run(f"insert into {name} select g, nullif(g % 20, 7), 'p' || g || '@example.org', "
           f"'Person ' || g, case when g % 3 = 0 then null else 'note ü ' || g end "
           "from generate_series(1, 60) g")
    pg.run(f"create publication {name} for table {name}")
    port = free_port()
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=f'schema_topic = "{schemas}"\n' + avro_kafka(registry_url),
                        routes=_routes(name, topic, TRANSFORMS),
                        extra=f'[metrics]\nlisten = "127.0.0.1:{port}"\n\n'
                              f'[console]\ntoken = "{TOKEN}"\n')
    log = tmp_path / "router.log"
    # the slot (creating it waits for transactions running on the server) and the snapshot
    first = run_router(cfg, timeout=300)
    proc = start_router(cfg, log)
    try:
        wait_for(lambda: http(f"http://127.0.0.1:{port}/readyz")[0] == 200,
                 "the router streaming", 90)
        pg.run(f"insert into {name} select g, g % 20, 'q' || g || '@example.org', 'P' || g, "
               "'x' from generate_series(61, 90) g")
        pg.run(f"update {name} set email = 'new' || id || '@example.org', age = age + 1 "
               "where id % 4 = 0")
        want = {i for (i,) in pg.run(f"select id from {name} where age > 5")}
        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext
        deser = AvroDeserializer(registry_client(registry_url))
        ctx = SerializationContext(topic, MessageField.VALUE)

        def folded():
            rows = {}
            for _, _, value in read_committed(kafka_bootstrap, topic):
                env = deser(value, ctx)
                if env["after"] is None:
                    rows.pop(env["before"]["id"], None)
                else:
                    rows[env["after"]["id"]] = env["after"]
            return rows if set(rows) == want and all(
                rows[i]["email"] != _pg_hash(pg, salt, f"'p{i}@example.org'")
                for i in want if i % 4 == 0 and i <= 60) else None
        rows = wait_for(folded, "the snapshot and the stream's rows, transformed", 90, every=1)
        assert _shape(rows) == _expected(pg, name, salt)
        # a backfill (pgrouter snapshot) writes the rows again, transformed alike
        asked = subprocess.run([sys.executable, "-m", "actors.cli", "snapshot", "-c", str(cfg),
                                "--route", name, "--table", f"public.{name}"],
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert asked.returncode == 0, asked.stderr

        def backfilled():
            got = {}
            for _, _, value in read_committed(kafka_bootstrap, topic):
                env = deser(value, ctx)
                if env["op"] == "r" and env["source"]["xid"]:  # 0: the initial snapshot's
                    got[env["after"]["id"]] = env["after"]
            return got if set(got) == want else None
        again = wait_for(backfilled, "the backfill's rows", 90, every=1)
        assert _shape(again) == _expected(pg, name, salt)
        status = http(f"http://127.0.0.1:{port}/api/status")[1]
        verified, doc, err = verify(cfg)  # the table side transformed as the topic's
        assert verified == 0, (err, doc)
    finally:
        stop(proc)
    try:
        assert len(rows) > 40
        # the Avro schema types the hashed int as a string
        subject = registry_get(registry_url, f"/subjects/{topic}-value/versions/latest")
        ages = list(_fields_named(json.loads(subject["schema"]), "age"))
        assert ages and all(json.dumps(t) in ('["null", "string"]', '"string"')
                            for t in ages), ages
        # nowhere the salt
        check = subprocess.run([sys.executable, "-m", "actors.cli", "check", "-c", str(cfg)],
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
        places = {"log": log.read_bytes() + (first.stdout + first.stderr).encode(),
                  "verify": (err + json.dumps(doc)).encode(),
                  "status": status,
                  "check": (check.stdout + check.stderr).encode(),
                  "registry": json.dumps(registry_get(
                      registry_url, f"/subjects/{topic}-value/versions/latest")).encode()}
        for t in (topic, schemas):
            places[t] = b"".join((k or b"") + (v or b"") for _, k, v in
                                 read_committed(kafka_bootstrap, t))
        for where, data in places.items():
            assert salt.encode() not in data and salt.encode("unicode_escape") not in data, where
        # a transformed key column is refused by check unless transform_keys = true
        keyed = source_config(tmp_path / "k.toml", pg_dsn, kafka_bootstrap, name,
                              routes=_routes(name, topic, TRANSFORMS.replace(
                                  '["age", "email"]', '["age", "email", "id"]')))
        refused = subprocess.run([sys.executable, "-m", "actors.cli", "check", "-c",
                                  str(keyed)], capture_output=True, text=True, timeout=120,
                                 cwd=ROOT)
        out = refused.stdout + refused.stderr
        assert refused.returncode != 0 and "transform_keys" in out and ".id is part of the " \
            "record key" in out, out
        assert salt not in out
        misspelt = source_config(tmp_path / "m.toml", pg_dsn, kafka_bootstrap, name,
                                 routes=_routes(
                                     name, topic, TRANSFORMS.replace('"email"', '"e_mail"')))
        refused = subprocess.run([sys.executable, "-m", "actors.cli", "check", "-c",
                                  str(misspelt)], capture_output=True, text=True, timeout=120,
                                 cwd=ROOT)
        out = refused.stdout + refused.stderr
        assert refused.returncode != 0 and "routes[0].transforms[0].columns" in out and \
            "'e_mail'" in out, out
    finally:
        drop_made(pg, name, if_exists=False)
        delete_topics(kafka_bootstrap, [topic, schemas])


def _pg_hash(pg, salt: str, literal: str) -> str:
    return pg.one(f"select encode(sha256(convert_to(%s || {literal}, 'UTF8')), 'hex')", salt)


def _fields_named(node, name):
    """The types of every field called ``name`` anywhere in an Avro schema."""
    if isinstance(node, dict):
        if node.get("name") == name and "type" in node:
            yield node["type"]
        for v in node.values():
            yield from _fields_named(v, name)
    elif isinstance(node, list):
        for v in node:
            yield from _fields_named(v, name)


def _expected(pg, name: str, salt: str) -> dict:
    """id -> (age, email, name, note) as PostgreSQL computes the transforms."""
    return {i: rest for i, *rest in (tuple(r) for r in pg.run(
        "select id, encode(sha256(convert_to(%s || age::text, 'UTF8')), 'hex'), "
        "encode(sha256(convert_to(%s || email::text, 'UTF8')), 'hex'), "
        f"case when name is null then null else '****' end, left(note, 3) "
        f"from {name} where age > 5", salt, salt))}


def _shape(rows: dict) -> dict:
    return {i: [r["age"], r["email"], r["name"], r["note"]] for i, r in rows.items()}
