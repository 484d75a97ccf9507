"""Avro and Kafka Connect records of types a hostile user picks, in the snapshot and the
stream, against what PostgreSQL itself says: arrays of enums and of domains, domains over
numeric(6,2), varchar(5) and another domain, a composite, ranges and multiranges,
hstore-like text, json with ``\\u0000`` escapes and jsonb with non-ASCII, bit/varbit,
interval edges, time 24:00:00, timetz, a negative money, numeric NaN/Infinity inside arrays,
empty, multi-dimensional (text) and lower-bounded arrays with NULLs, bytea edges, uuid,
inet/cidr, oid, float4 denormals and NaN in an array, timestamptz[] with infinity; then a
column added mid-stream (an enum array, a numeric domain) and a domain column retyped to
bigint mid-stream, under BACKWARD. The C encoder and the pure-Python twin
(``PGROUTER_PURE_PYTHON=1``) write the same records.

Avro is read with fastavro over the registry's schema of each record's id (date/time logical
types as their plain int/long), Connect records as plain JSON (and, in
``test_format_connect_worker``, by Kafka Connect's own ``JsonConverter``). Arrays whose
elements are a user type (enum, domain, composite) are written as one string, PostgreSQL's
array literal (``docs/record-formats.md``)."""

from __future__ import annotations

import base64
import io
import json
import struct
from decimal import Decimal

import pytest

from tests.e2e.sources import source_config
from tests.e2e.test_avro_format import (BACKWARD, avro_kafka, registry_client, registry_get,
                                        route)
from tests.e2e.test_format_edges import (connect_decimal, decimal_or_none, iso_micros,
                                         micros_sql, plain_logical, row_fields, scaled)
from tests.helpers import Pg, read_topic, run_router, unique

pytestmark = pytest.mark.services

COLUMNS = """id int primary key, moods {n}_mood[], dints {n}_dint[], dnum {n}_dnum,
    dvc {n}_dvc, ddom {n}_ddom, comp {n}_comp, r int4range, mr int4multirange, hs text, j json,
    jb jsonb, b bit(4), vb varbit, iv interval, t24 time, t3 time(3), ttz timetz, m money,
    nans numeric[], n62a numeric(6,2)[], a0 int[], ta2 text[], ba bytea, baa bytea[], u uuid,
    i inet, c cidr, o oid, lb int[], dnuma {n}_dnum[], f4a float4[], ts6a timestamptz[]"""
ROWS = [
    """1, '{happy,sad,"it''s"}', '{1,NULL,3}', 12.345, 'abcde', 7, '(1,"x,y")', '[1,5)',
    '{[1,3),[7,9)}', '"a"=>"b\\"c", "n"=>NULL',
    '{"k": "\\u00e9\\u0000\\ud83d\\ude00", "z": [1, 2.50]}',
    '{"k": "é😀", "n": 1.50}', B'1010', B'', '-178000000 years -1 mon -1 day -00:00:00.000001',
    '24:00:00', '24:00:00', '24:00:00-15:59', '-92233720368547758.08',
    '{1.5,NaN,NULL,Infinity}', '{1.5,NULL,NaN}', '{}', '{{a,NULL},{"NULL","x y"}}', '\\x',
    '{"\\\\x00ff",NULL,"\\\\x"}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '::ffff:1.2.3.4/96',
    '10.0.0.0/8', 4294967295, '[0:2]={1,2,3}', '{1.255,NULL}', '{NaN,-Infinity,1.5e-45}',
    '{"2024-01-01 00:00:00+05:30",infinity}'""",
    """2, '{}', '{}', -0.01, '', 1, '(,)', 'empty', '{}', '', 'null', '[]', B'0000', B'1',
    '0', '00:00:00', '23:59:59.999', '00:00:00+15:59', '0', '{}', '{}', NULL, '{}', '\\x00',
    '{}', NULL, NULL, NULL, 0, NULL, '{}', '{3.4028235e38}', '{}'""",
]
STREAMED = ", ".join(c.split()[0] for c in COLUMNS.replace("\n", " ").split(", "))
#: what PostgreSQL says each value is (text, or numbers for the typed columns)
EXPECTED = f"""select id, moods::text, dints::text, dnum::text, dvc, ddom::int8, comp::text,
    r::text, mr::text, hs, j::text, jb::text, b::text, vb::text, iv::text,
    extract(epoch from t24) * 1000000, extract(epoch from t3) * 1000, ttz::text, m::text,
    array(select e::text from unnest(nans) e), array(select e::text from unnest(n62a) e),
    a0, ta2::text, encode(ba, 'hex'), array(select encode(e, 'hex') from unnest(baa) e),
    u::text, i::text, c::text, o::int8, array(select e from unnest(lb) e), dnuma::text,
    array(select e::text from unnest(f4a) e),
    array(select {micros_sql("(e at time zone 'UTC')")} from unnest(ts6a) e),
    added::text, addn::text
    from {{table}} order by id"""
NAMES = ["id", "moods", "dints", "dnum", "dvc", "ddom", "comp", "r", "mr", "hs", "j", "jb", "b",
         "vb", "iv", "t24", "t3", "ttz", "m", "nans", "n62a", "a0", "ta2", "ba", "baa", "u", "i",
         "c", "o", "lb", "dnuma", "f4a", "ts6a", "added", "addn"]
#: a two-dimensional text array: its inner arrays as their text
TA2 = {'{{a,NULL},{"NULL","x y"}}': ["{a,NULL}", '{"NULL","x y"}'], "{}": []}
#: the worker's Cast of the bytes columns to base64 (``test_format_connect_worker``)
CAST_SPEC = "ba:string,dnum_value:string"


def f32(text):
    """A float4's text as the float the record holds (NaN/±Infinity: null)."""
    if text is None or text in ("NaN", "Infinity", "-Infinity"):
        return None
    return struct.unpack("<f", struct.pack("<f", float(text)))[0]


def expected_rows(pg: Pg, table: str) -> dict[int, dict]:
    out = {}
    for row in pg.run(EXPECTED.format(table=table)):
        exp = dict(zip(NAMES, row))
        rid = exp.pop("id")
        for c in ("dnum", "addn"):
            exp[c] = decimal_or_none(exp[c])
        for c in ("t24", "t3"):
            exp[c] = None if exp[c] is None else int(exp[c])
        for c in ("nans", "n62a"):
            exp[c] = None if exp[c] is None else [decimal_or_none(e) for e in exp[c]]
        exp["ta2"] = None if exp["ta2"] is None else TA2[exp["ta2"]]
        exp["f4a"] = None if exp["f4a"] is None else [f32(e) for e in exp["f4a"]]
        exp["ts6a"] = None if exp["ts6a"] is None else [
            None if e is None else int(e) for e in exp["ts6a"]]
        out[rid] = exp
    return out


def fix_nulls(pg: Pg, table: str, want: dict[int, dict]) -> None:
    """array(select … unnest(NULL)) is '{}': put back the NULL arrays."""
    cols = ["nans", "n62a", "baa", "lb", "f4a", "ts6a"]
    for row in pg.run(f"select id, {', '.join(f'{c} is null' for c in cols)} from {table}"):
        for c, null in zip(cols, row[1:]):
            if null:
                want[row[0]][c] = None


def make_table(pg: Pg, n: str) -> None:
    pg.run(f"create type {n}_mood as enum ('happy', 'sad', 'it''s')")
    pg.run(f"create domain {n}_dint as int check (value > 0)")
    pg.run(f"create domain {n}_dnum as numeric(6,2)")
    pg.run(f"create domain {n}_dvc as varchar(5)")
    pg.run(f"create domain {n}_ddom as {n}_dint")
    pg.run(f"create type {n}_comp as (a int, b text)")
    pg.run(f"create table {n} ({COLUMNS.format(n=n)})")
    for row in ROWS:
        pg.run(f"insert into {n} values ({row})")
    pg.run(f"create publication {n} for table {n}")


def stream_copies(pg: Pg, n: str) -> None:
    pg.run(f"insert into {n} ({STREAMED}) select id + 100, {STREAMED[4:]} from {n}")


def drop_table(pg: Pg, n: str) -> None:
    pg.drop_slot(n)
    pg.run(f"drop publication if exists {n}")
    pg.run(f"drop table if exists {n}")
    for d in ("ddom", "dint", "dnum", "dvc"):
        pg.run(f"drop domain if exists {n}_{d} cascade")
    pg.run(f"drop type if exists {n}_mood cascade")
    pg.run(f"drop type if exists {n}_comp cascade")


def evolve(pg: Pg, n: str) -> None:
    """Mid-stream: two columns added (an enum array, a numeric domain), then the domain
    column retyped to bigint."""
    pg.run(f"alter table {n} add column added {n}_mood[], add column addn {n}_dnum")
    pg.run(f"insert into {n} (id, added, addn) values (200, '{{sad,happy}}', -1.5)")
    pg.run(f"alter table {n} alter column ddom type bigint")
    pg.run(f"insert into {n} (id, ddom) values (201, 5000000000)")


def add_missing(pg: Pg, n: str) -> None:
    """Before ``evolve`` has run, EXPECTED's added columns do not exist: add them empty."""
    pg.run(f"alter table {n} add column if not exists added text, "
           "add column if not exists addn numeric")


# -- one record's row, read back into EXPECTED's form ------------------------------------

def _hex(b64):
    return None if b64 is None else base64.b64decode(b64).hex()


def _vsd(v):
    if v is None:
        return None
    if isinstance(v, dict) and isinstance(v["value"], bytes):
        return scaled(int.from_bytes(v["value"], "big", signed=True), v["scale"])
    return connect_decimal(v["value"], v["scale"])


def _each(conv):
    return lambda v: None if v is None else [None if e is None else conv(e) for e in v]


CONNECT = {"dnum": _vsd, "addn": _vsd, "nans": _each(_vsd),
           "n62a": _each(lambda e: connect_decimal(e, 2)), "ba": _hex, "baa": _each(_hex),
           "f4a": _each(f32), "ts6a": _each(iso_micros)}
AVRO = {"dnum": _vsd, "addn": _vsd, "nans": _each(_vsd), "ba": lambda b: b.hex(),
        "baa": _each(lambda b: b.hex()), "u": str, "f4a": _each(f32)}


def compare(rows: list[dict], want: dict[int, dict], readers: dict) -> None:
    assert sorted(r["id"] for r in rows) == sorted(want)
    for row in rows:
        got = {c: (readers[c](row.get(c)) if c in readers and row.get(c) is not None
                   else row.get(c)) for c in NAMES if c != "id"}
        assert got == want[row["id"]], (row["id"], {c: (got[c], want[row["id"]][c])
                                                    for c in got if got[c] != want[row["id"]][c]})


def run_corpus(pg: Pg, name: str, cfg) -> dict[int, dict]:
    """Snapshot (ids 1, 2), stream (101, 102), columns added and retyped (200, 201)."""
    make_table(pg, name)
    run_router(cfg)
    stream_copies(pg, name)
    evolve(pg, name)
    run_router(cfg)
    want = expected_rows(pg, name)
    fix_nulls(pg, name, want)
    return want


@pytest.mark.parametrize("pure", [False, True], ids=["native", "pure"])
def test_avro_hostile_types(pg_dsn, kafka_bootstrap, registry_url, tmp_path, monkeypatch,
                            pure):
    import fastavro

    if pure:
        monkeypatch.setenv("PGROUTER_PURE_PYTHON", "1")
    pg = Pg(pg_dsn)
    name = unique("hsav")
    topic = f"{name}.t"
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        routes=route(name, topic), kafka_extra=f'schema_topic = "{name}.schemas"\n'
                        + avro_kafka(registry_url, registry=BACKWARD))
    try:
        want = run_corpus(pg, name, cfg)
        client, schemas, rows = registry_client(registry_url), {}, []
        for r in read_topic(kafka_bootstrap, topic, decode=False, settle=0):
            raw = r["raw"][1]
            sid = int.from_bytes(raw[1:5], "big")
            if sid not in schemas:
                text = json.loads(client.get_schema(sid).schema_str)
                schemas[sid] = (fastavro.parse_schema(plain_logical(text)), text)
            rows.append(fastavro.schemaless_reader(io.BytesIO(raw[5:]), schemas[sid][0])["after"])
        compare(rows, want, AVRO)
        # snapshot and stream share a version; the added columns and the retype are two more
        assert registry_get(registry_url, f"/subjects/{topic}-value/versions") == [1, 2, 3]
        fields = row_fields(max(schemas.values(), key=lambda s: len(json.dumps(s[1])))[1])
        assert fields["ddom"] == "long" and fields["dnum"]["name"] == \
            "VariableScaleDecimal"
        assert fields["moods"] == fields["dints"] == fields["added"] == "string"
    finally:
        drop_table(pg, name)
        pg.close()


def test_connect_hostile_types(pg_dsn, kafka_bootstrap, tmp_path):
    pg = Pg(pg_dsn)
    name = unique("hscx")
    topic = f"{name}.t"
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        routes=route(name, topic),
                        kafka_extra=f'schema_topic = "{name}.schemas"\nformat = "connect"\n')
    try:
        want = run_corpus(pg, name, cfg)
        records = [r["value"] for r in read_topic(kafka_bootstrap, topic, settle=0)]
        compare([v["payload"]["after"] for v in records], want, CONNECT)
        last = {f["field"]: f for f in records[-1]["schema"]["fields"][1]["fields"]}
        assert last["ddom"]["type"] == "int64" and last["added"]["type"] == "string"
    finally:
        drop_table(pg, name)
        pg.close()


# -- what Kafka Connect's JsonConverter parsed (test_format_connect_worker) ---------------

def flat_names(names: list[str]) -> list[str]:
    """The row's fields after Connect's ``Flatten`` (a VariableScaleDecimal: two fields)."""
    out = []
    for n in names:
        out += [f"{n}_scale", f"{n}_value"] if n in ("dnum", "addn") else [n]
    return out


def _java_list(conv):
    def read(text):
        assert text[:1] == "[" and text[-1:] == "]", text
        items = text[1:-1].split(", ") if text != "[]" else []
        return [None if e == "null" else conv(e) for e in items]
    return read


#: columns whose toString Connect prints without loss (bytes in lists, structs in lists not)
WORKER = {"moods": str, "dints": str, "dvc": str, "ddom": int, "comp": str, "r": str, "mr": str,
          "hs": str, "j": str, "jb": str, "b": str, "vb": str, "iv": str, "t24": int, "t3": int,
          "ttz": str, "m": str, "n62a": _java_list(Decimal), "a0": _java_list(int),
          "ta2": _java_list(str), "u": str, "i": str, "c": str, "o": int,
          "lb": _java_list(int), "dnuma": str, "f4a": _java_list(f32),
          "ts6a": _java_list(iso_micros)}


def check_connect_worker(pg: Pg, name: str, rows: list[dict[str, str]]) -> None:
    add_missing(pg, name)
    want = expected_rows(pg, name)
    fix_nulls(pg, name, want)
    assert sorted(int(r["id"]) for r in rows) == sorted(want)
    for raw in rows:
        exp = want[int(raw["id"])]
        got = {c: None if raw.get(c) is None else read(raw[c]) for c, read in WORKER.items()}
        got["ba"] = _hex(raw.get("ba"))
        got["dnum"] = (None if "dnum_value" not in raw else scaled(int.from_bytes(
            base64.b64decode(raw["dnum_value"]), "big", signed=True), int(raw["dnum_scale"])))
        assert got == {c: exp[c] for c in got}, (raw["id"], {
            c: (got[c], exp[c]) for c in got if got[c] != exp[c]})
