"""Avro and Kafka Connect records of values at the edges of their types, in the initial
snapshot and in the stream, read by readers that are not pgrouter's and compared with what
PostgreSQL itself computes: dates and timestamps of years past 9999 and BC, where Avro's long
ends, ±infinity, time 24:00:00, numeric(6,2)[] and timestamp(3)[] elements typed as their
column, numeric NaN and 1100 digits; a domain column typed as its base type on every path,
so the registry's BACKWARD check passes from the snapshot to the stream.

Avro is read with fastavro over the schemas the registry holds (fetched by id with
confluent-kafka's registry client); its date and timestamp logical types are read as the
plain int/long they are (fastavro's own converters give Python ``date``/``datetime``, which
hold neither BC nor years past 9999). Connect records are read as plain JSON."""

from __future__ import annotations

import base64
import io
import json
import re
from decimal import Decimal

import pytest

from tests.e2e.sources import source_config
from tests.e2e.test_avro_format import (BACKWARD, avro_kafka, registry_client, registry_get,
                                        route)
from tests.helpers import Pg, read_topic, run_router, unique
from tests.router.test_avro_fastavro import ref_days

pytestmark = pytest.mark.services

COLUMNS = ("id int primary key, d date, ts timestamp, ts3 timestamp(3), tz timestamptz, "
           "t time, n numeric(6,2), an numeric(6,2)[], ats3 timestamp(3)[], v numeric, "
           "pos {dom}, cash money, tags text[]")
# one row per line: id, d, ts, ts3, tz, t, n, an, ats3, v, pos, cash, tags
ROWS = [
    "1, '10000-01-01', '10000-01-01 00:00:00', '10000-01-01 00:00:00.123', "
    "'10000-01-01 00:00:00+00', '24:00:00', 9999.99, '{1.50,NULL,-9999.99}', "
    "'{\"10000-01-01 00:00:00.123\",NULL}', 'NaN', 3, 12.5, '{{a,b},{c,NULL}}'",
    "2, '0001-12-31 BC', '0044-03-15 12:00:00.000001 BC', '4713-11-24 00:00:00 BC', "
    "'0044-03-15 12:00:00+01 BC', '00:00:00', -9999.99, '{}', "
    "'{\"0001-01-01 00:00:00.5 BC\"}', (repeat('9', 1000) || '.' || repeat('1', 100))::numeric, 7, "
    "-0.01, '{}'",
    "3, '5874897-12-31', '294246-12-31 23:59:59.999999', '294276-12-31 23:59:59.999', "
    "'294247-01-10 04:00:54.775807+00', '23:59:59.999999', 0, NULL, NULL, 'Infinity', 1, "
    "NULL, NULL",
    "4, 'infinity', '294247-01-10 04:00:54.775808', '-infinity', "
    "'294276-12-31 23:59:59.999999+00', NULL, NULL, NULL, NULL, '-0.000100', 2147483647, "
    "NULL, NULL",
    "5, '4713-11-24 BC', '4713-11-24 00:00:00 BC', 'infinity', '-infinity', NULL, NULL, NULL, "
    "NULL, NULL, NULL, NULL, NULL",
]
LONG = (-2**63, 2**63 - 1)


def micros_sql(expr: str) -> str:
    """µs since the epoch of timestamp ``expr``, exact, computed by PostgreSQL (NULL for
    ±infinity)."""
    return (f"case when isfinite({expr}) then ({expr}::date - date '1970-01-01')::numeric "
            f"* 86400000000 + extract(epoch from {expr}::time) * 1000000 end")


EXPECTED = f"""select id, case when isfinite(d) then d - date '1970-01-01' end,
    {micros_sql('ts')}, floor(({micros_sql('ts3')}) / 1000),
    {micros_sql("(tz at time zone 'UTC')")}, extract(epoch from t) * 1000000, n::text,
    case when an is not null then array(select e::text from unnest(an) e) end,
    case when ats3 is not null then
        array(select floor(({micros_sql('e')}) / 1000) from unnest(ats3) e) end, v::text,
    pos::int, cash::text, tags::text from {{table}} order by id"""


def long_or_none(v):
    return None if v is None or not LONG[0] <= v <= LONG[1] else int(v)


def decimal_or_none(text):
    return None if text is None or text in ("NaN", "Infinity", "-Infinity") else Decimal(text)


def scaled(n: int, scale: int) -> Decimal:
    return Decimal(f"{n}e-{scale}")  # exact (scaleb rounds to the context's 28 digits)


#: a two-dimensional text array: its inner arrays as their text
TAGS = {1: ["{a,b}", "{c,NULL}"], 2: []}


def expected_rows(pg: Pg, table: str) -> dict[int, dict]:
    out = {}
    """id -> each column's value as PostgreSQL computes it (timestamps: exact µs/ms, None
    for ±infinity)."""
    for (rid, d, ts, ts3, tz, t, n, an, ats3, v, pos, cash, _) in pg.run(
            EXPECTED.format(table=table)):
        out[rid] = {"d": d, "ts": exact(ts), "ts3": exact(ts3), "tz": exact(tz),
                    "t": None if t is None else int(t),
                    "n": decimal_or_none(n),
                    "an": None if an is None else [decimal_or_none(e) for e in an],
                    "ats3": None if ats3 is None else [long_or_none(e) for e in ats3],
                    "v": decimal_or_none(v), "pos": pos, "cash": cash,
                    "tags": TAGS.get(rid % 100)}
    return out


def exact(v):
    return None if v is None else int(v)


def make_table(pg: Pg, name: str, dom: str) -> None:
    pg.run(f"create domain {dom} as int check (value > 0)")
    pg.run(f"create table {name} ({COLUMNS.format(dom=dom)})")
    for row in ROWS:
        pg.run(f"insert into {name} values ({row})")
    pg.run(f"create publication {name} for table {name}")


def drop_table(pg: Pg, name: str, dom: str, slot: str) -> None:
    pg.drop_slot(slot)
    pg.run(f"drop publication if exists {name}")
    pg.run(f"drop table if exists {name}")
    pg.run(f"drop domain if exists {dom}")


def snapshot_then_stream(pg: Pg, name: str, cfg) -> None:
    """The rows by the initial snapshot (ids 1–5), then the same values streamed (101–105)."""
    run_router(cfg)
    pg.run(f"insert into {name} select id + 100, d, ts, ts3, tz, t, n, an, ats3, v, pos, cash, "
           f"tags from {name}")
    run_router(cfg)


# -- Avro -----------------------------------------------------------------------------------

def plain_logical(schema):
    """``schema`` with date and timestamp logical types removed: fastavro then reads them as
    the int/long they are."""
    if isinstance(schema, list):
        return [plain_logical(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: plain_logical(v) for k, v in schema.items()}
    if out.get("logicalType", "").endswith(("date", "timestamp-micros", "timestamp-millis",
                                            "time-micros", "time-millis")):
        del out["logicalType"]
    return out


def avro_values(bootstrap, topic, url):
    """(value dict, value schema) of every record, read with fastavro over the registry's
    schema of its id."""
    import fastavro

    client = registry_client(url)
    schemas, out = {}, []
    for r in read_topic(bootstrap, topic, decode=False, settle=0):
        raw = r["raw"][1]
        assert raw[:1] == b"\x00"
        sid = int.from_bytes(raw[1:5], "big")
        if sid not in schemas:
            text = json.loads(client.get_schema(sid).schema_str)
            schemas[sid] = (fastavro.parse_schema(plain_logical(text)), text)
        body = io.BytesIO(raw[5:])
        out.append((fastavro.schemaless_reader(body, schemas[sid][0]), schemas[sid][1]))
        assert body.read() == b""
    return out


def vsd_decimal(v):
    if v is None:
        return None
    return scaled(int.from_bytes(v["value"], "big", signed=True), v["scale"])


def row_fields(schema: dict) -> dict:
    before = next(f for f in schema["fields"] if f["name"] == "before")
    record = next(t for t in before["type"] if isinstance(t, dict))
    return {f["name"]: f["type"][1] for f in record["fields"]}


def test_avro_edge_values_in_snapshot_and_stream(pg_dsn, kafka_bootstrap, registry_url,
                                                 tmp_path):
    pg = Pg(pg_dsn)
    name = unique("edav")
    topic, dom = f"{name}.t", f"{name}_dom"
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        routes=route(name, topic), kafka_extra=f'schema_topic = "{name}.schemas"\n'
                        + avro_kafka(registry_url, registry=BACKWARD))
    try:
        make_table(pg, name, dom)
        snapshot_then_stream(pg, name, cfg)
        want = expected_rows(pg, name)
        records = avro_values(kafka_bootstrap, topic, registry_url)
        assert sorted(v["after"]["id"] for v, _ in records) == sorted(want)
        assert {v["op"] for v, _ in records if v["after"]["id"] < 100} == {"r"}
        assert {v["op"] for v, _ in records if v["after"]["id"] > 100} == {"c"}
        # the domain column is an int in the snapshot's schema as in the stream's: one version
        assert registry_get(registry_url, f"/subjects/{topic}-value/versions") == [1]
        fields = row_fields(records[0][1])
        assert fields["pos"] == "int"
        assert fields["an"]["items"][1]["logicalType"] == "decimal"
        assert (fields["an"]["items"][1]["precision"], fields["an"]["items"][1]["scale"]) == (6, 2)
        assert fields["ats3"]["items"][1]["logicalType"] == fields["ts3"]["logicalType"] == \
            "local-timestamp-millis"
        for value, _ in records:
            got = dict(value["after"])
            exp = dict(want[got.pop("id")])
            for c in ("ts", "ts3", "tz"):  # past Avro's long: null
                exp[c] = long_or_none(exp[c])
            got["v"] = vsd_decimal(got["v"])
            assert got == exp, (got, exp)
    finally:
        drop_table(pg, name, dom, name)
        pg.close()


# -- Kafka Connect --------------------------------------------------------------------------

_ISO = re.compile(r"([+-]?\d{4,})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?Z\Z")


def iso_micros(text):
    """µs since the epoch of an ISO-8601 UTC instant (years signed and past 9999 as Java
    prints them)."""
    if text is None:
        return None
    m = _ISO.match(text)
    assert m, text
    days = ref_days(int(m[1]), int(m[2]), int(m[3]))
    secs = (int(m[4]) * 60 + int(m[5])) * 60 + int(m[6])
    return (days * 86400 + secs) * 1_000_000 + int((m[7] or "").ljust(6, "0")[:6])


def connect_decimal(b64, scale):
    if b64 is None:
        return None
    return scaled(int.from_bytes(base64.b64decode(b64), "big", signed=True), scale)


def test_connect_edge_values_in_snapshot_and_stream(pg_dsn, kafka_bootstrap, tmp_path):
    pg = Pg(pg_dsn)
    name = unique("edcx")
    topic, dom = f"{name}.t", f"{name}_dom"
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name,
                        routes=route(name, topic),
                        kafka_extra=f'schema_topic = "{name}.schemas"\nformat = "connect"\n')
    try:
        make_table(pg, name, dom)
        snapshot_then_stream(pg, name, cfg)
        want = expected_rows(pg, name)
        records = [r["value"] for r in read_topic(kafka_bootstrap, topic, settle=0)]
        assert sorted(v["payload"]["after"]["id"] for v in records) == sorted(want)
        schemas = {json.dumps(v["schema"], sort_keys=True) for v in records}
        assert len(schemas) == 1  # snapshot and stream: one schema, the domain an int32
        fields = {f["field"]: f for f in records[0]["schema"]["fields"][1]["fields"]}
        assert fields["pos"]["type"] == "int32"
        assert fields["ats3"]["items"]["name"] == fields["ts3"]["name"] == \
            "io.debezium.time.Timestamp"
        assert fields["an"]["items"]["parameters"] == {"scale": "2",
                                                       "connect.decimal.precision": "6"}
        for v in records:
            got = dict(v["payload"]["after"])
            exp = dict(want[got.pop("id")])
            for c in ("ts", "ts3"):  # Connect's int64: null past it; tz is a string
                exp[c] = long_or_none(exp[c])
            got["tz"] = iso_micros(got["tz"])
            got["n"] = connect_decimal(got["n"], 2)
            got["an"] = None if got["an"] is None else [connect_decimal(e, 2)
                                                         for e in got["an"]]
            got["v"] = None if got["v"] is None else connect_decimal(got["v"]["value"],
                                                                     got["v"]["scale"])
            assert got == exp, (got, exp)
    finally:
        drop_table(pg, name, dom, name)
        pg.close()
