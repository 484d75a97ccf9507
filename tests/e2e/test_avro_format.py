"""``[kafka] format = "avro"`` against the real schema registry (Apicurio, Confluent API):
confluent-kafka's ``AvroDeserializer`` (an independent reader) reads every record, and every
value equals what the JSON format carries for the same change, as PostgreSQL judges it
(both cast to the column's type and printed by it); schema evolution while the router runs; the initial
snapshot and exactly-once in Avro; ``pgrouter status`` and ``pgrouter decode --topic`` on
Avro topics."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
import urllib.request
from decimal import Decimal

import pytest

from tests.conftest import ROOT
from tests.e2e.sources import drop_made, new_table, source_config
from tests.helpers import Pg, kill9, run_router, start_router, unique, write_config
from tests.e2e.test_exactly_once import read_committed

pytestmark = pytest.mark.services

# name, type, a value (SQL literal), whose Avro form is null where Avro cannot hold it
CORPUS = [
    ("amount", "numeric(10,2)", "-12345678.90"), ("neg", "numeric(5,-2)", "1234500"),
    ("ratio", "numeric", "-0.001230"), ("nan", "numeric", "'NaN'"),
    ("at", "timestamp", "'2024-01-02 03:04:05.123456'"),
    ("at3", "timestamp(3)", "'1969-12-31 23:59:59.999'"),
    ("atz", "timestamptz", "'2024-01-02 03:04:05.5+02'"), ("inf", "timestamptz", "'infinity'"),
    ("day", "date", "'2024-02-29'"), ("tod", "time", "'13:14:15.25'"),
    ("todz", "timetz", "'13:14:15+02'"), ("flag", "bool", "true"), ("f4", "float4", "1.5"),
    ("f", "float8", "'-Infinity'"), ("small", "int2", "-32768"), ("big", "int8", "9223372036854775807"),
    ("raw", "bytea", "'\\x00ff10'"), ("ints", "int[]", "'{1,NULL,3}'"),
    ("tags", "text[]", "'{\"a b\",NULL,\"c,d\"}'"), ("uid", "uuid",
                                                     "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"),
    ("doc", "jsonb", "'{\"k\": [1, \"x\"]}'"), ("span", "interval", "'1 day 02:03:04'"),
    ("mood", "{mood}", "'happy'"), ("pos", "{dom}", "42"), ("pt", "point", "'(1,2)'"),
    ("word", "varchar(8)", "'héllo'"), ("txt", "text", "repeat('x', 10000)"),
]
NULL_IN_AVRO = {"nan", "inf", "f"}


def avro_text(v):
    """A datum confluent-kafka's AvroDeserializer returns, as text PostgreSQL reads back."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "t" if v else "f"
    if isinstance(v, (bytes, bytearray)):
        return "\\x" + bytes(v).hex()
    if isinstance(v, dict) and set(v) == {"scale", "value"}:  # VariableScaleDecimal
        return str(Decimal(int.from_bytes(v["value"], "big", signed=True)).scaleb(-v["scale"]))
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "{" + ",".join("NULL" if e is None else json.dumps(avro_text(e))
                              for e in v) + "}"
    return str(v)


def json_text(v):
    if v is None:
        return None
    if isinstance(v, bool):
        return "t" if v else "f"
    return v if isinstance(v, str) else json.dumps(v)


def registry_client(url):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": url})


def avro_records(bootstrap, topic, url, *, committed=False):
    """Every record of ``topic`` decoded by confluent-kafka's AvroDeserializer:
    (key dict or None, value dict)."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from tests.helpers import read_topic

    deser = AvroDeserializer(registry_client(url))
    raw = ([(k, v) for _, k, v in read_committed(bootstrap, topic)] if committed else
           [r["raw"] for r in read_topic(bootstrap, topic, decode=False)])
    out = []
    for k, v in raw:
        key = None if k is None else deser(k, SerializationContext(topic, MessageField.KEY))
        out.append((key, deser(v, SerializationContext(topic, MessageField.VALUE))))
    return out


def registry_get(url, path):
    with urllib.request.urlopen(url.rstrip("/") + path, timeout=10) as r:
        return json.loads(r.read())


def registry_put(url, path, body):
    req = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(body).encode(),
                                 method="PUT",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def avro_kafka(url, extra="", registry=""):
    """``[kafka]`` keys of the Avro format with the registry at ``url``; ``extra``: more
    ``[kafka]`` keys, ``registry``: more ``[kafka.registry]`` keys."""
    return (f'client = "librdkafka"\nformat = "avro"\n{extra}\n'
            f'[kafka.registry]\n{registry}url = "{url}"\n')


#: ``avro_kafka``'s ``registry`` for subjects checked under BACKWARD compatibility
BACKWARD = 'compatibility = "BACKWARD"\n'


def route(name, topic):
    return (f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\ntopic = "{topic}"\n'
            f'topic_settings = {{ partitions = 1 }}\n')


def test_avro_records_equal_the_json_format(pg_dsn, kafka_bootstrap, registry_url, tmp_path):
    """The same changes through two slots, one router writing JSON and one Avro: every Avro
    record, read by confluent-kafka's deserializer, holds what its JSON twin holds (each value
    cast to the column type by PostgreSQL and compared there), keys included; a key change
    is a delete and a create; unchanged TOAST is the placeholder named in unchanged_toast."""
    pg = Pg(pg_dsn)
    name = unique("av")
    mood, dom = f"{name}_mood", f"{name}_dom"
    corpus = [(c, t.format(mood=mood, dom=dom), v) for c, t, v in CORPUS]
    pg.run(f"create type {mood} as enum ('sad', 'happy')")
    pg.run(f"create domain {dom} as int check (value > 0)")
    pg.run(f"create table {name} (id int primary key, "
           + ", ".join(f"{c} {t}" for c, t, _ in corpus) + ")")
    pg.run(f"alter table {name} alter column txt set storage external")
    pg.run(f"create publication {name} for table {name}")
    cfgs = {}
    for fmt in ("json", "avro"):
        kafka = avro_kafka(registry_url) if fmt == "avro" else 'client = "librdkafka"\n'
        cfgs[fmt] = write_config(tmp_path / f"{fmt}.toml", dsn=pg_dsn, slot=f"{name}_{fmt}",
                                 publications=[name], bootstrap=kafka_bootstrap,
                                 kafka_extra=f'schema_topic = "{name}.schemas"\n' + kafka,
                                 routes=route(name, f"{name}.{fmt}"),
                                 extra='[snapshot]\nmode = "never"\n')
    try:
        for cfg in cfgs.values():
            run_router(cfg)  # creates the slots
        pg.run(f"insert into {name} values (1, " + ", ".join(v for _, _, v in corpus) + ")")
        pg.run(f"insert into {name} (id) values (2)")  # nulls
        pg.run(f"update {name} set id = 3, flag = false where id = 1")  # key change, toast kept
        pg.run(f"update {name} set word = 'w' where id = 3")
        pg.run(f"delete from {name} where id = 2")
        pg.run(f"truncate {name}")
        for cfg in cfgs.values():
            run_router(cfg)
        from tests.helpers import read_topic
        plain = read_topic(kafka_bootstrap, f"{name}.json")
        avro = avro_records(kafka_bootstrap, f"{name}.avro", registry_url)
        expected = []  # the JSON records, a key change as Debezium writes it
        for r in plain:
            v = r["value"]
            if v["op"] == "u" and v["before"] and v["before"]["id"] != v["after"]["id"]:
                expected.append(({"id": v["before"]["id"]}, dict(v, op="d", after=None,
                                                                 unchanged_toast=None)))
                expected.append(({"id": v["after"]["id"]}, dict(v, op="c")))  # old row kept
            else:
                expected.append((r["key"], v))
        assert [v["op"] for _, v in avro] == [v["op"] for _, v in expected] == [
            "c", "c", "d", "c", "u", "d", "t"]
        types = {c: t for c, t, _ in corpus} | {"id": "int"}
        for (akey, aval), (jkey, jval) in zip(avro, expected):
            assert akey == jkey
            assert aval["source"] == jval["source"] and aval["ts_ms"] == jval["ts_ms"]
            assert aval["unchanged_toast"] == jval.get("unchanged_toast")
            for side in ("before", "after"):
                arow, jrow = aval[side], jval[side]
                assert (arow is None) == (jrow is None), (side, aval, jval)
                if arow is None:
                    continue
                for col in types:
                    a = arow[col]
                    if side == "after" and col in (jval.get("unchanged_toast") or ()):
                        assert a == "__debezium_unavailable_value" and col not in jrow
                        continue
                    if col not in jrow:  # an old row of the replica identity: key only
                        assert a is None, (side, col, a)
                        continue
                    j = jrow[col]
                    if col in NULL_IN_AVRO and j is not None:
                        assert a is None, col  # Avro's type cannot hold it: documented
                        continue
                    same = pg.one(f"select %s::{types[col]}::text is not distinct from "
                                  f"%s::{types[col]}::text", avro_text(a), json_text(j))
                    assert same, (col, a, j)
        assert avro[-1][1]["truncate"] == {"cascade": False, "restart_identity": False}
        subjects = registry_get(registry_url, "/subjects")
        assert {f"{name}.avro-key", f"{name}.avro-value"} <= set(subjects)
    finally:
        for fmt in cfgs:
            pg.drop_slot(f"{name}_{fmt}")
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}")
        pg.run(f"drop type {mood}")
        pg.run(f"drop domain {dom}")
        pg.close()


def wait_for(check, timeout=60.0, what="a condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_schema_evolution_while_running(pg_dsn, kafka_bootstrap, registry_url, tmp_path):
    """A column added while the router runs registers a new version; a retype the registry
    refuses under BACKWARD stops the router with one line naming table, column, subject and
    level, confirming nothing past the last delivered record; once the subject is relaxed,
    the next start delivers the row (nothing lost)."""
    pg, name = new_table(pg_dsn, "ave", "id int primary key, n int")
    topic = f"{name}.t"
    subject = f"{topic}-value"
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=f'schema_topic = "{name}.schemas"\n' + avro_kafka(
                            registry_url, registry=BACKWARD),
                        routes=route(name, topic))
    log = tmp_path / "router.log"
    proc = start_router(cfg, log)
    try:
        pg.run(f"insert into {name} values (1, 1)")
        wait_for(lambda: len(avro_records(kafka_bootstrap, topic, registry_url)) == 1,
                 what="the first record")
        pg.run(f"alter table {name} add column note text")
        pg.run(f"insert into {name} values (2, 2, 'added')")
        records = wait_for(lambda: (lambda r: r if len(r) == 2 else None)(
            avro_records(kafka_bootstrap, topic, registry_url)), what="the second record")
        assert records[1][1]["after"] == {"id": 2, "n": 2, "note": "added"}
        assert registry_get(registry_url, f"/subjects/{subject}/versions") == [1, 2]
        assert registry_get(registry_url, f"/config/{subject}")["compatibilityLevel"] == "BACKWARD"
        confirmed_before = pg.one("select confirmed_flush_lsn from pg_replication_slots "
                                  "where slot_name = %s", name)
        pg.run(f"alter table {name} alter column n type text")  # int -> string: refused
        pg.run(f"insert into {name} values (3, 'three', 'retyped')")
        proc.wait(timeout=60)
        assert proc.returncode not in (0, None)
        text = log.read_text()
        line = [ln for ln in text.splitlines() if "refused the new value schema" in ln]
        assert len(line) == 1, text[-3000:]
        for part in (f"public.{name}", "column n retyped int4 -> text", repr(subject),
                     "BACKWARD"):
            assert part in line[0], (part, line[0])
        assert "Traceback" not in text
        assert len(avro_records(kafka_bootstrap, topic, registry_url)) == 2
        lsn_after_alter = pg.one("select pg_current_wal_lsn()")
        confirmed = pg.one("select confirmed_flush_lsn from pg_replication_slots "
                           "where slot_name = %s", name)
        assert pg.one("select %s::pg_lsn < %s::pg_lsn", confirmed, lsn_after_alter)
        assert pg.one("select %s::pg_lsn >= %s::pg_lsn", confirmed, confirmed_before)
        # a new process, which registered nothing yet, names the change against the
        # subject's latest schema, and stops again
        again = subprocess.run([sys.executable, "-m", "actors.cli", "run", "-c", str(cfg),
                                "--until-caught-up"], capture_output=True, text=True,
                               timeout=120, cwd=ROOT)
        assert again.returncode == 1 and "Traceback" not in again.stderr
        assert "column n retyped int -> string" in again.stderr, again.stderr[-2000:]
        registry_put(registry_url, f"/config/{subject}", {"compatibility": "NONE"})
        run_router(tmp_path / "r.toml")
        records = avro_records(kafka_bootstrap, topic, registry_url)
        assert [r[1]["after"] for r in records[2:]] == [{"id": 3, "n": "three",
                                                         "note": "retyped"}]
    finally:
        kill9(proc)
        drop_made(pg, name, if_exists=False)


def test_initial_snapshot_and_exactly_once_in_avro(pg_dsn, kafka_bootstrap, registry_url,
                                                   tmp_path):
    """The initial snapshot's rows and the stream, in Kafka transactions, all Avro: a
    read_committed consumer decodes each once; their keys match the key's schema id; status
    reads the newest commit time of the Avro topic."""
    pg, name = new_table(pg_dsn, "avs", "id int primary key, v text, at timestamptz")
    topic = f"{name}.t"
    pg.run(f"insert into {name} select g, 'v' || g, now() from generate_series(1, 500) g")
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=(f'schema_topic = "{name}.schemas"\n' + avro_kafka(
                            registry_url, f'exactly_once = true\ncommitted_lsn_topic = '
                                          f'"{name}.p"\n')),
                        routes=route(name, topic))
    try:
        run_router(cfg)
        pg.run(f"update {name} set v = 'changed' where id <= 10")
        run_router(cfg)
        records = avro_records(kafka_bootstrap, topic, registry_url, committed=True)
        ops = [v["op"] for _, v in records]
        assert ops.count("r") == 500 and ops.count("u") == 10 and len(ops) == 510
        assert {k["id"] for k, _ in records} == set(range(1, 501))
        folded = {}
        for k, v in records:
            folded[k["id"]] = v["after"]["v"]
        assert pg.one(f"select count(*) from {name} where v = 'changed'") == 10
        assert sorted(i for i, v in folded.items() if v == "changed") == list(range(1, 11))
        status = subprocess.run([sys.executable, "-m", "actors.cli", "status", "-c", str(cfg),
                                 "--json"], capture_output=True, text=True, timeout=120,
                                cwd=ROOT)
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        [t] = report["routes"][name]
        assert t["topic"] == topic and t["last_commit_time"], report
        shown = subprocess.run([sys.executable, "-m", "actors.cli", "decode", "-c", str(cfg),
                                "--topic", topic, "--tail", "4"], capture_output=True,
                               text=True, timeout=120, cwd=ROOT)
        assert shown.returncode == 0, shown.stderr
        lines = [json.loads(ln) for ln in shown.stdout.splitlines()]
        # (the last 4 offsets: 3 records and the Kafka transaction's commit marker)
        assert [ln["value"]["op"] for ln in lines] == ["u", "u", "u"], lines
        assert all(ln["value"]["after"]["v"] == "changed" and ln["key"] == {
            "id": ln["value"]["after"]["id"]} for ln in lines), lines
    finally:
        drop_made(pg, name, if_exists=False)


def test_unreachable_registry_is_one_line_and_confirms_nothing(pg_dsn, kafka_bootstrap,
                                                               tmp_path):
    pg, name = new_table(pg_dsn, "avu", "id int primary key")
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=avro_kafka("http://127.0.0.1:9/apis/ccompat/v7"),
                        routes=route(name, f"{name}.t"))
    try:
        proc = subprocess.run([sys.executable, "-m", "actors.cli", "check", "-c", str(cfg)],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "Traceback" not in out
        assert "kafka.registry.url" in out and "unreachable" in out, out
    finally:
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}")
        pg.close()


class RegistryGate:
    """An HTTP proxy in front of the registry that answers 503 while closed (a registry that
    is down behind its load balancer)."""

    def __init__(self, target: str, *, auth: str = "", tls=None):
        """``auth``: the ``user:password`` it demands (HTTP basic); ``tls``: a
        ``trustme.CA`` whose server certificate it serves HTTPS with."""
        import base64
        import http.server
        import ssl
        import threading
        import urllib.error

        self.open = threading.Event()
        self.open.set()
        self.refused = 0
        gate = self
        want = "Basic " + base64.b64encode(auth.encode()).decode() if auth else None

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self):
                if want is not None and self.headers.get("Authorization") != want:
                    gate.refused += 1
                    self.send_response(401)
                    self.end_headers()
                    self.wfile.write(b'{"message": "unauthorized (test gate)"}')
                    return
                if not gate.open.is_set():
                    self.send_response(503)
                    self.end_headers()
                    self.wfile.write(b'{"message": "registry down (test gate)"}')
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                req = urllib.request.Request(target.rstrip("/") + self.path, data=body,
                                             method=self.command,
                                             headers={k: v for k, v in self.headers.items()
                                                      if k.lower() in ("content-type",
                                                                       "accept")})
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        status, data = r.status, r.read()
                except urllib.error.HTTPError as exc:
                    status, data = exc.code, exc.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _forward

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.issue_cert("127.0.0.1").configure_cert(context)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def test_a_registry_down_mid_stream_is_retried_and_confirms_nothing(
        pg_dsn, kafka_bootstrap, registry_url, tmp_path):
    """The registry answers 503 when the first record of a table needs its schema: the sink
    retries in place with a warning line within seconds; the slot is not confirmed past the
    record while it waits; once the registry is back the record arrives and the slot moves."""
    pg, name = new_table(pg_dsn, "avd", "id int primary key")
    topic = f"{name}.t"
    gate = RegistryGate(registry_url)
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra=f'schema_topic = "{name}.schemas"\n' + avro_kafka(gate.url),
                        routes=route(name, topic), extra='[snapshot]\nmode = "never"\n')
    log = tmp_path / "router.log"
    proc = start_router(cfg, log)
    try:
        wait_for(lambda: "streaming started" in log.read_text(), what="the router to stream")
        gate.open.clear()
        pg.run(f"insert into {name} values (1)")
        written = pg.one("select pg_current_wal_lsn()")
        wait_for(lambda: "schema registry unavailable, retrying" in log.read_text(),
                 timeout=15, what="the retry line")
        time.sleep(2)  # status updates go on meanwhile: none may confirm the record
        assert pg.one("select confirmed_flush_lsn < %s::pg_lsn from pg_replication_slots "
                      "where slot_name = %s", written, name)
        assert proc.poll() is None, log.read_text()[-2000:]
        gate.open.set()
        wait_for(lambda: len(avro_records(kafka_bootstrap, topic, registry_url)) == 1,
                 what="the record after the registry came back")
        wait_for(lambda: pg.one("select confirmed_flush_lsn >= %s::pg_lsn from "
                                "pg_replication_slots where slot_name = %s", written, name),
                 what="the slot to move past the record")
        assert "Traceback" not in log.read_text()
    finally:
        kill9(proc)
        gate.close()
        drop_made(pg, name, if_exists=False)


def test_registry_behind_basic_auth_and_tls(pg_dsn, kafka_bootstrap, registry_url, tmp_path):
    """A registry that demands basic auth over HTTPS with a private CA: the configured
    credentials and CA file work; a wrong password is one line from pgrouter check (no
    password in it), and the router does not start."""
    import trustme

    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    gate = RegistryGate(registry_url, auth="pgr:s3cret-pw", tls=ca)
    pg, name = new_table(pg_dsn, "ava", "id int primary key")
    topic = f"{name}.t"
    pg.run(f"create publication {name} for table {name}")

    def config(password):
        return write_config(
            tmp_path / "r.toml", dsn=pg_dsn, slot=name, publications=[name],
            bootstrap=kafka_bootstrap,
            kafka_extra=f'schema_topic = "{name}.schemas"\n' + avro_kafka(gate.url) + (
                f'username = "pgr"\npassword = "{password}"\nssl_ca_location = "{ca_file}"\n'),
            routes=route(name, topic), extra='[snapshot]\nmode = "never"\n')
    try:
        bad = config("wrong-pw")
        check = subprocess.run([sys.executable, "-m", "actors.cli", "check", "-c", str(bad)],
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
        out = check.stdout + check.stderr
        assert check.returncode == 1 and "refused the credentials (401)" in out, out
        assert "wrong-pw" not in out and "Traceback" not in out
        cfg = config("s3cret-pw")
        run_router(cfg)  # creates the slot
        pg.run(f"insert into {name} values (1), (2)")
        run_router(cfg)
        assert [v["after"] for _, v in avro_records(kafka_bootstrap, topic, registry_url)] == [
            {"id": 1}, {"id": 2}]
        assert gate.refused >= 1
    finally:
        gate.close()
        drop_made(pg, name, if_exists=False)


def test_auto_register_off_needs_the_schemas_registered(pg_dsn, kafka_bootstrap, registry_url,
                                                        tmp_path):
    """With auto_register = false a subject without pgrouter's schema stops the router with
    one line (nothing confirmed past it); once the schema is registered the same changes
    are delivered, under the ids the registry already holds."""
    pg, name = new_table(pg_dsn, "avn", "id int primary key")
    topic = f"{name}.t"
    pg.run(f"create publication {name} for table {name}")

    def config(auto):
        return write_config(
            tmp_path / f"r-{auto}.toml", dsn=pg_dsn, slot=name, publications=[name],
            bootstrap=kafka_bootstrap,
            kafka_extra=f'schema_topic = "{name}.schemas"\n' + avro_kafka(registry_url)
            + f"auto_register = {auto}\n",
            routes=route(name, topic), extra='[snapshot]\nmode = "never"\n')
    try:
        fixed = config("false")
        run_router(fixed)  # creates the slot; nothing to send yet
        pg.run(f"insert into {name} values (1)")
        proc = subprocess.run([sys.executable, "-m", "actors.cli", "run", "-c", str(fixed),
                               "--until-caught-up"], capture_output=True, text=True,
                              timeout=120, cwd=ROOT)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert f"subject '{topic}-value'" in proc.stderr and "auto_register = false" in \
            proc.stderr, proc.stderr[-2000:]
        assert avro_records(kafka_bootstrap, topic, registry_url) == []
        run_router(config("true"))  # registers them (and delivers the row)
        pg.run(f"insert into {name} values (2)")
        run_router(fixed)
        assert [v["after"]["id"] for _, v in avro_records(kafka_bootstrap, topic,
                                                           registry_url)] == [1, 2]
    finally:
        drop_made(pg, name, if_exists=False)
