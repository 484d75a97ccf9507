"""The materializer on Avro topics (the router's ``[kafka] format = "avro"``, schemas in the dev
stack's registry), with PostgreSQL as the oracle: the Delta tables equal PostgreSQL as they do
from JSON topics (same columns, same Spark types), but for what the Avro format itself cannot
carry (NaN and ±Infinity in float columns and in unconstrained numeric: NULL).

* The state-mode workload of ``test_materialize`` (duplicates, late older records, unchanged
  TOAST against the batch and the stored row, key changes, a truncate, an added column), its
  records converted to Avro as the router's sink converts them;
* the whole pipeline, PostgreSQL -> ``pgrouter run`` with ``format = "avro"`` -> Kafka -> the
  job -> Delta, over a type corpus (everything the JSON materializer tests cover, and the types
  Avro carries in their own form: decimals of more than 38 digits, time, bytea[], numeric[]…),
  in state mode, and in changelog mode against the same topics with the same column types;
  columns whose names Avro refuses (a key among them);
* an Avro record that does not decode, and Avro records without ``[kafka.registry]``, stop the
  job naming the record.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import urllib.request
import uuid
from decimal import Decimal

import pytest

from tests.e2e.test_avro_format import avro_kafka
from tests.e2e.test_materialize import Feed, Oracle, _config, _delta_rows

pytestmark = [pytest.mark.services, pytest.mark.spark]


@pytest.fixture
def subjects(registry_url):
    """Registry subjects a test names (``subjects.add``), deleted at its end (both steps of
    the Confluent API: soft, then permanent)."""
    made: set[str] = set()
    yield made
    for subject in sorted(made):
        for suffix in ("", "?permanent=true"):
            req = urllib.request.Request(
                f"{registry_url.rstrip('/')}/subjects/{urllib.request.quote(subject, safe='')}"
                f"{suffix}", method="DELETE")
            try:
                urllib.request.urlopen(req, timeout=10).close()
            except OSError:
                pass  # gone already, or never registered


def _registry(url: str):
    from actors.materialize.settings import RegistrySettings

    return RegistrySettings(url=url)


class AvroFeed(Feed):
    """``Feed`` writing what the router's sink writes with ``format = "avro"``: each JSON record
    converted by ``router.formats.avro.AvroFormat`` (a key change becomes a delete and a create),
    its schemas registered in the registry; the schema topic stays JSON."""

    def __init__(self, bootstrap: str, tag: str, registry_url: str, subjects: set):
        from actors.kafka.registry import RegistryClient
        from router.formats.avro import AvroFormat

        super().__init__(bootstrap, tag)
        self.format = AvroFormat()
        self.client = RegistryClient(_registry(registry_url))
        subjects.update({f"{self.topic}-key", f"{self.topic}-value"})

    def schema(self, enc) -> None:
        super().schema(enc)
        self.format.learn(enc.schema)

    def avro(self, kv: tuple[bytes, bytes]) -> list[tuple[bytes | None, bytes]]:
        from router.formats.avro import SchemasNeeded

        record = (self.topic, kv[0], kv[1], None)
        try:
            converted = self.format.convert_all([record])
        except SchemasNeeded as need:
            for s in need.subjects:
                self.format.set_id(s, self.client.register(s.subject, s.schema))
            converted = self.format.convert_all([record])
        return [(k, v) for _, k, v, _ in converted]

    def send(self, kv: tuple[bytes, bytes]) -> tuple[bytes, bytes]:
        for k, v in self.avro(kv):
            self.producer.send(self.topic, key=k, value=v)
        self.sent.append(kv)
        return kv


def _no_nonfinite_floats(row: tuple) -> tuple:
    """A row of ``Oracle.rows`` as the Avro format carries it: its float column ``f`` (the
    5th) NULL where PostgreSQL holds NaN or ±Infinity."""
    f = row[4]
    if f == "nan" or (isinstance(f, float) and math.isinf(f)):
        return (*row[:4], None, *row[5:])
    return row


def test_state_from_avro_matches_postgres(spark, pg_dsn, kafka_bootstrap, registry_url,
                                          subjects, tmp_path):
    """``test_materialize.test_state_matches_postgres``'s workload on an Avro topic."""
    from actors.materialize import job
    from delta.tables import DeltaTable

    tag = uuid.uuid4().hex[:8]
    feed = AvroFeed(kafka_bootstrap, tag, registry_url, subjects)
    pg = Oracle(pg_dsn, feed, f"mza_orders_{tag}")
    cfg = _config(tmp_path, kafka_bootstrap, feed, "state", registry=_registry(registry_url))
    path = f"{cfg.warehouse}/orders/public/{pg.table}"
    long_note = "toast me " * 400

    def run_and_compare():
        feed.flush()
        job.Materializer(spark, cfg).run(available_now=True)
        assert _delta_rows(spark, path, pg.extra) == [_no_nonfinite_floats(r) for r in pg.rows()]

    try:
        # batch 1: inserts of every type, updates, unchanged TOAST, delete, key change,
        # duplicates
        tx = feed.tx()
        first = {}
        for i in range(1, 9):
            first[i] = pg.insert(tx, i, {
                "id": i, "name": f"n{i} ü" if i % 3 else None, "amount": Decimal(f"{i}.5{i}"),
                "big": ("123456789012345678901234567890.000000000000000000001" if i == 1 else
                        "-0.00000000000000000000000000000000000000000012345" if i == 2 else i),
                "f": ["NaN", "Infinity", "-Infinity", 1.5, -0.25, None, 1e300, 3][i - 1],
                "ok": [True, False, None][i % 3], "d": f"2024-01-0{i}" if i > 1 else "0044-03-15",
                "ts": f"2024-01-02 03:04:0{i}.12345{i}" if i > 1 else "1500-06-01 12:00:00",
                "tstz": f"2024-01-02 03:04:05.5+0{i}:30",
                "raw": bytes([0, i, 255]), "tags": [i, None, -i] if i % 2 else [],
                "doc": json.dumps({"k": i, "s": "x\"y"}), "note": long_note + str(i)})
        tx = feed.tx()
        upd1 = pg.update(tx, 0, 1, {"name": "renamed"})
        pg.update(tx, 1, 2, {"amount": Decimal("99.99")}, toast=("note",))
        tx = feed.tx()
        pg.delete(tx, 0, 3)
        pg.update(tx, 1, 4, {"id": 104, "name": "moved"}, toast=("note",))  # the old key's TOAST
        feed.send(first[5])  # duplicates, byte-identical
        feed.send(upd1)
        run_and_compare()
        history = DeltaTable.forPath(spark, path).history().collect()
        assert [h.operation for h in reversed(history)] == ["CREATE TABLE", "WRITE"]
        types = {f.name: f.dataType.simpleString()
                 for f in spark.read.format("delta").load(path).schema.fields}
        assert types == {  # the JSON path's types (test_materialize_types)
            "id": "int", "name": "string", "amount": "decimal(12,2)", "big": "string",
            "f": "double", "ok": "boolean", "d": "date", "ts": "timestamp_ntz",
            "tstz": "timestamp", "raw": "binary", "tags": "array<int>", "doc": "string",
            "note": "string", "_pgr_commit_lsn": "bigint", "_pgr_seq": "bigint",
            "_pgr_deleted": "boolean", "_pgr_deleted_at": "timestamp"}

        # batch 2: late older records, TOAST against the stored value, an added column
        feed.send(first[3])  # older than the delete of 3: must not resurrect it
        feed.send(first[1])  # older than the rename of 1: must not overwrite it
        feed.send(first[4])  # older than the key change
        tx = feed.tx()
        pg.update(tx, 0, 2, {"name": "toast kept"}, toast=("note", "doc"))
        ins9 = pg.insert(tx, 1, {"id": 9, "name": "nine", "note": "short"})
        pg.add_column()
        tx = feed.tx()
        pg.update(tx, 0, 5, {"extra": 42})
        pg.update(tx, 2, 7, {"id": 107}, toast=("note", "doc"))  # the old key's stored TOAST
        pg.insert(tx, 1, {"id": 11, "name": "eleven", "extra": -7})
        run_and_compare()

        # batch 3: truncate, then changes after it in the same batch; late records from before
        tx = feed.tx()
        pg.truncate(tx, 0)
        tx = feed.tx()
        ins20 = pg.insert(tx, 0, {"id": 20, "name": "after truncate", "note": long_note,
                                  "extra": 1})
        pg.insert(tx, 1, {"id": 21, "name": "twenty-one"})
        tx = feed.tx()
        pg.update(tx, 0, 20, {"name": "after truncate, updated"}, toast=("note",))
        feed.send(ins9)
        feed.send(ins20)
        feed.send(first[6])
        run_and_compare()
        assert len(pg.rows()) == 2

        # a re-run with the same checkpoint finds nothing new and changes nothing
        before = spark.read.format("delta").load(path).count()
        run_and_compare()
        assert spark.read.format("delta").load(path).count() == before
    finally:
        pg.cur.execute(f"DROP TABLE IF EXISTS {pg.table}")
        pg.conn.close()


def test_a_record_that_does_not_decode_stops_the_batch(spark, kafka_bootstrap, registry_url,
                                                       subjects, tmp_path):
    """An Avro record whose body does not decode with the schema its id names: the job stops
    naming its Kafka position before anything of the batch is written; without
    ``[kafka.registry]`` the first Avro record stops it, saying what to configure."""
    from actors.materialize import job
    from router.formats.envelope import TableEncoder
    from router.pgoutput import Relation, RelationColumn

    feed = AvroFeed(kafka_bootstrap, uuid.uuid4().hex[:8], registry_url, subjects)
    rel = Relation(5, "public", "spoiled", "d", (RelationColumn(1, "id", 23, -1),
                                                 RelationColumn(0, "n", 25, -1)))
    enc = TableEncoder(rel, route="r", db="postgres")
    feed.schema(enc)
    good = enc.encode("c", feed.tx(), 1, 0, old=None, old_is_key=False, new=("1", "ten"))
    feed.send(good)
    [(key, value)] = feed.avro(good)
    spoiled = value[:6] + b"\x7f"  # before NULL, then a union index ``after`` does not have
    at = feed.producer.send(feed.topic, key=key, value=spoiled).get(timeout=30)
    feed.send(enc.encode("c", feed.tx(), 1, 0, old=None, old_is_key=False, new=("2", "20")))
    feed.flush()

    bare = _config(tmp_path / "bare", kafka_bootstrap, feed, "state")
    with pytest.raises(job.MaterializeError) as err:
        job.Materializer(spark, bare).run(available_now=True)
    assert (f"record at {feed.topic} partition " in str(err.value)
            and "is Avro (Confluent wire format, schema id "
                f"{int.from_bytes(value[1:5], 'big')}) and the config has no [kafka.registry]"
            in str(err.value)), str(err.value)

    cfg = _config(tmp_path, kafka_bootstrap, feed, "state", registry=_registry(registry_url))
    with pytest.raises(job.MaterializeError) as err:
        job.Materializer(spark, cfg).run(available_now=True)
    assert str(err.value) == (
        f"record at {feed.topic} partition {at.partition} offset {at.offset} is not a pgrouter "
        f"change record (Avro that does not decode with schema id "
        f"{int.from_bytes(value[1:5], 'big')} of the registry): {spoiled.hex().upper()!r}")
    assert not os.path.exists(f"{cfg.warehouse}/r/public/spoiled")


# --- the whole pipeline: PostgreSQL -> pgrouter run (Avro) -> Kafka -> Spark -> Delta ---------

#: (column, type, value in row 1, value in row 2): row 2 holds the edges; row 3 is NULLs
CORPUS = [
    ("name", "text", "'n1 ü'", "''"),
    ("amount", "numeric(10,2)", "12345678.90", "'NaN'"),
    ("big", "numeric", "'123456789012345678901234567890.000000000000000000001'",
     "'-0.000000000000000000000000000000000000000000123450'"),
    ("small_num", "numeric", "'-1.50'", "'NaN'"),
    ("wide", "numeric(50,10)", "'-1234567890123456789012345678901234567890.0123456789'",
     "'0.0000000001'"),
    ("neg", "numeric(5,-2)", "1234500", "-9999900"),
    ("at", "timestamptz", "'2024-01-02 03:04:05.123456+02'", "'infinity'"),
    ("at3", "timestamptz(3)", "'1969-12-31 23:59:59.999+00'", "'-infinity'"),
    ("ts", "timestamp", "'2024-01-02 03:04:05.123456'", "'1500-06-01 12:00:00'"),
    ("ts3", "timestamp(3)", "'2024-01-02 03:04:05.5'", "'infinity'"),
    ("d", "date", "'2024-02-29'", "'0044-03-15'"),
    ("di", "date", "'1999-12-31'", "'infinity'"),
    ("tm", "time", "'13:14:15.25'", "'24:00:00'"),
    ("tm3", "time(3)", "'00:00:00.001'", "'23:59:59.999'"),
    ("ttz", "timetz", "'10:00+05:30'", "'00:00:00-08'"),
    ("iv", "interval", "'1 day 02:03:04.5'", "'-3 mons'"),
    ("s", "smallint", "-32768", "32767"),
    ("i8", "bigint", "9223372036854775807", "-9223372036854775808"),
    ("o", "oid", "4294967295", "0"),
    ("b", "bool", "true", "false"),
    ("f4", "real", "0.25", "'NaN'"),
    ("f8", "double precision", "1.7976931348623157e308", "'-Infinity'"),
    ("f8b", "double precision", "-4.9e-324", "'Infinity'"),
    ("u", "uuid", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
     "'00000000-0000-0000-0000-000000000000'"),
    ("j", "jsonb", "'{\"k\": [1, null], \"é\": \"a\\\"b\"}'", "'[]'"),
    ("js", "json", "'{\"k\":  [1, null]}'", "'null'"),
    ("by", "bytea", "'\\x00ff10'", "''"),
    ("tags", "int[]", "'{1,NULL,3}'", "'{}'"),
    ("tx", "text[]", "array['plain', 'with \"quotes\"', 'comma,here', '{braces}', 'back\\slash', "
     "null, 'NULL', '']", "'{}'"),
    ("nums", "numeric[]", "'{1.50,-0.001,123456789012345678901234567890123456789.5}'", "'{}'"),
    ("tms", "time[]", "'{13:14:15.25,NULL,24:00:00}'", "'{}'"),
    ("bys", "bytea[]", "array['\\x00ff'::bytea, null, '']", "'{}'"),
    ("days", "date[]", "'{2024-02-29,NULL}'", "'{}'"),
    ("tstzs", "timestamptz[]", "'{\"2024-01-02 03:04:05+02\"}'", "'{}'"),
    ("flags", "bool[]", "'{t,f,NULL}'", "'{}'"),
    ("mo", "money", "12.5", "-0.01"),
    ("ip", "inet", "'10.0.0.1/24'", "'::1'"),
    ("mac", "macaddr", "'08:00:2b:01:02:03'", "'ff:ff:ff:ff:ff:ff'"),
    ("bt", "bit(4)", "B'1010'", "B'0000'"),
    ("ch", "char(5)", "'ab'", "''"),
    ("vc", "varchar(10)", "'hello'", "''"),
    ("en", "{mood}", "'happy'", "'sad'"),
    ("dm", "{dom}", "7", "0"),
    ("cp", "{pair}", "'(1,\"x, y\")'", "'(,)'"),
    ("note", "text", "repeat('toast ', 2000)", "'short'"),
]
#: the Spark type of each column: the JSON path's (columns.spark_type_name)
TYPES = {
    "id": "int", "name": "string", "amount": "decimal(10,2)", "big": "string",
    "small_num": "string", "wide": "string", "neg": "decimal(7,0)", "at": "timestamp",
    "at3": "timestamp", "ts": "timestamp_ntz", "ts3": "timestamp_ntz", "d": "date",
    "di": "date", "tm": "string", "tm3": "string", "ttz": "string", "iv": "string",
    "s": "smallint", "i8": "bigint", "o": "bigint", "b": "boolean", "f4": "float",
    "f8": "double", "f8b": "double", "u": "string", "j": "string", "js": "string",
    "by": "binary", "tags": "array<int>", "tx": "array<string>", "nums": "array<string>",
    "tms": "array<string>", "bys": "string", "days": "array<date>",
    "tstzs": "array<timestamp>", "flags": "array<boolean>", "mo": "string", "ip": "string",
    "mac": "string", "bt": "string", "ch": "string", "vc": "string", "en": "string",
    "dm": "int", "cp": "string", "note": "string", "extra": "bigint"}


def _expected(col: str, typ: str) -> str:
    """The SQL of a column's value as the Delta table holds it from an Avro topic: the Spark
    value psycopg2 gives (numbers, dates, timestamps, bytes, arrays) or PostgreSQL's text; NULL
    where neither Spark (±infinity, NaN in numeric(p,s)) nor Avro (NaN, ±Infinity in floats
    and unconstrained numeric) holds the value."""
    spark = TYPES[col]
    if spark in ("timestamp", "timestamp_ntz", "date"):
        return f"case when isfinite({col}) then {col} end"
    if spark in ("float", "double"):
        return f"case when {col} not in ('NaN', 'Infinity', '-Infinity') then {col} end"
    if col in ("amount", "big", "small_num"):
        return f"case when {col} <> 'NaN' then {col}{'::text' if spark == 'string' else ''} end"
    if spark == "string" and col not in ("ch", "ip"):  # (their output functions' text)
        return f"{col}::text"
    if spark == "array<string>" and col != "tx":
        return f"{col}::text[]"
    return col


def _row(r: dict) -> dict:
    def norm(v):
        if isinstance(v, (bytes, bytearray, memoryview)):
            return bytes(v)
        if isinstance(v, dt.datetime) and v.tzinfo is not None:
            return round(v.timestamp(), 6)
        if isinstance(v, list):
            return [norm(e) for e in v]
        return v
    return {k: norm(v) for k, v in r.items()}


def _spark_row(r: dict) -> dict:
    """Spark's timestamps (``timestamp``: local datetimes of an instant) as instants."""
    def norm(k, v):
        if TYPES[k] == "timestamp" and v is not None:
            return round(v.timestamp(), 6)
        if TYPES[k] == "array<timestamp>" and v is not None:
            return [e if e is None else round(e.timestamp(), 6) for e in v]
        return bytes(v) if isinstance(v, bytearray) else v
    return {k: norm(k, v) for k, v in r.items()}


def test_pipeline_postgres_router_avro_delta(spark, pg_dsn, kafka_bootstrap, registry_url,
                                            subjects, tmp_path):
    """PostgreSQL -> ``pgrouter run`` (``format = "avro"``) -> Kafka -> the job -> Delta, in
    state mode, compared with PostgreSQL after each of two incremental runs: the type corpus
    (the Delta columns of the JSON path's Spark types), unchanged TOAST, key changes (one of a
    two-column key, whose columns' names Avro refuses), deletes, a truncate, an added column;
    the same topics in changelog mode:
    every change once, a re-run adding nothing."""
    from actors.materialize import job
    from tests.helpers import Pg, run_router, unique, write_config

    pg = Pg(pg_dsn)
    name = unique("mzav")
    t, k = f"{name}_t", f"{name}_k"
    mood, dom, pair = f"{name}_mood", f"{name}_dom", f"{name}_pair"
    corpus = [(c, typ.format(mood=mood, dom=dom, pair=pair), v1, v2) for c, typ, v1, v2 in CORPUS]
    pg.run(f"create type {mood} as enum ('sad', 'happy')")
    pg.run(f"create domain {dom} as int check (value >= 0)")
    pg.run(f"create type {pair} as (a int, b text)")
    pg.run(f"create table {t} (id int primary key, "
           + ", ".join(f"{c} {typ}" for c, typ, _, _ in corpus) + ")")
    pg.run(f"alter table {t} alter column note set storage external")  # TOAST, uncompressed
    # names Avro refuses (Delta takes them; not spaces, which it refuses without column
    # mapping, from JSON topics alike): fields of other names, the column's in pgrouter.column
    pg.run(f'create table {k} (k1 int, "k-2" text, "Größe" text, "1st" int, '
           f'primary key (k1, "k-2"))')
    pg.run(f"create publication {name} for table {t}, {k}")
    topic = f"{name}.public"
    subjects.update({f"{topic}.{x}-{kind}" for x in (t, k) for kind in ("key", "value")})
    router_cfg = write_config(
        tmp_path / "router.toml", dsn=pg_dsn, slot=name, publications=[name],
        bootstrap=kafka_bootstrap,
        kafka_extra=f'schema_topic = "{name}.schemas"\n' + avro_kafka(registry_url),
        routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{t}", "public.{k}"]\n'
               f'topic = "{{route}}.{{schema}}.{{table}}"\n',
        extra='[snapshot]\nmode = "never"\n')

    def config(mode):
        return job.JobConfig(bootstrap_servers=kafka_bootstrap,
                             topic_pattern=f"{name}\\.public\\..*", schema_topic=f"{name}.schemas",
                             warehouse=str(tmp_path / f"wh-{mode}"),
                             checkpoint=str(tmp_path / f"ck-{mode}"), mode=mode,
                             registry=_registry(registry_url))
    state = config("state")
    columns = ["id", *[c for c, *_ in corpus], "extra"]

    def materialize_and_compare(extra: bool):
        run_router(router_cfg)
        job.Materializer(spark, state).run(available_now=True)
        table = spark.read.format("delta").load(f"{state.warehouse}/{name}/public/{t}")
        types = {f.name: f.dataType.simpleString() for f in table.schema.fields}
        assert {c: types[c] for c in columns if c in types} == {
            c: TYPES[c] for c in columns if c != "extra" or extra}
        cols = [c for c in columns if c in types]
        got = {r["id"]: _spark_row(r.asDict()) for r in
               table.filter("NOT _pgr_deleted").select(*cols).collect()}
        sql = ", ".join(f"{_expected(c, typ)} as {c}" for c, typ in
                        [("id", "int"), *[(c, typ) for c, typ, *_ in corpus],
                         *([("extra", "bigint")] if extra else [])])
        cur = pg.conn.cursor()
        cur.execute(f"select {sql} from {t}")
        names = [d.name for d in cur.description]
        want = {r[0]: _row(dict(zip(names, r))) for r in cur.fetchall()}
        assert set(got) == set(want)
        for id_ in sorted(want):
            assert got[id_] == want[id_], id_
        keyed = spark.read.format("delta").load(f"{state.warehouse}/{name}/public/{k}")
        assert sorted(tuple(r) for r in keyed.filter("NOT _pgr_deleted").select(
            "k1", "k-2", "Größe", "1st").collect()) == sorted(
            pg.run(f'select k1, "k-2", "Größe", "1st" from {k}'))

    values1 = ", ".join(v for _, _, v, _ in corpus)
    values2 = ", ".join(v for _, _, _, v in corpus)
    try:
        pg.run(f"select pg_create_logical_replication_slot('{name}', 'pgoutput')")
        pg.run(f"insert into {t} values (1, {values1}), (2, {values2})")
        pg.run(f"insert into {t} (id) values (3)")  # NULLs
        pg.run(f"insert into {t} select i, {values1} from generate_series(10, 30) i")
        pg.run(f"update {t} set name = 'toast kept' where id between 10 and 15")  # note: TOAST
        pg.run(f"delete from {t} where id between 16 and 18")
        pg.run(f"update {t} set id = id + 1000, vc = 'moved' where id between 19 and 21")
        pg.run(f"insert into {k} values (1, 'a', 'x', 1), (2, 'b', 'y', 2), (3, 'c😀', null, 3)")
        pg.run(f"""update {k} set "k-2" = 'moved', "Größe" = 'changed' where k1 = 2""")
        materialize_and_compare(extra=False)

        pg.run(f"truncate {t}")
        pg.run(f"insert into {t} select i, {values1} from generate_series(100, 110) i")
        pg.run(f"insert into {t} values (111, {values2}), (112, {values1})")
        pg.run(f"alter table {t} add column extra bigint")
        pg.run(f"update {t} set extra = id * 2, name = 'toast again' where id < 105")
        pg.run(f"update {t} set id = id + 500, name = 'moved' where id in (106, 107)")  # TOAST
        pg.run(f"update {t} set b = null, tm = '00:00', big = big * -1 where id = 108")
        pg.run(f"delete from {t} where id in (109, 111)")
        pg.run(f"update {t} set note = note || '!' where id = 110")  # TOAST changed
        pg.run(f"delete from {k} where k1 = 1")
        materialize_and_compare(extra=True)

        changelog = config("changelog")
        job.Materializer(spark, changelog).run(available_now=True)
        log = spark.read.format("delta").load(f"{changelog.warehouse}/{name}/public/{t}")
        assert {f.name: f.dataType.simpleString() for f in log.schema.fields
                if f.name in TYPES} == {c: TYPES[c] for c in columns}
        positions = [(r[0], r[1]) for r in log.select("_pgr_commit_lsn", "_pgr_seq").collect()]
        assert len(positions) == len(set(positions))
        ops = {r[0]: r[1] for r in log.groupBy("_pgr_op").count().collect()}
        # 3 + 21 + 11 + 2 inserts; 6 + 3 (key changes: one update each) + 5 + 2 + 1 + 1
        # updates; 3 + 2 deletes; one truncate
        assert ops == {"c": 37, "u": 18, "d": 5, "t": 1}, ops
        moved = log.filter("_pgr_op = 'u' AND id = 1019").select("_pgr_before", "vc").collect()
        assert [(json.loads(r[0]), r[1]) for r in moved] == [({"id": 19}, "moved")]
        job.Materializer(spark, changelog).run(available_now=True)
        assert spark.read.format("delta").load(
            f"{changelog.warehouse}/{name}/public/{t}").count() == len(positions)
    finally:
        pg.drop_slot(name)
        pg.run(f"drop publication if exists {name}")
        pg.run(f"drop table if exists {t}, {k}")
        pg.run(f"drop type if exists {pair}; drop domain if exists {dom}; "
               f"drop type if exists {mood}")
        pg.close()
