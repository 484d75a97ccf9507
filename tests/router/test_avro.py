"""router.formats.avro: pgrouter's JSON records as Avro records in the Confluent wire format. Read
back with fastavro (an independent Avro implementation) against the schema text the registry
would hold; no registry here (ids are set by hand), the real one is in tests/integration."""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal

import fastavro
import msgspec
import pytest

from router.formats.avro import (AvroFormat, SchemasNeeded, Subject, avro_namespace, split_header,
                         subject_name)
from router.formats.avro_read import AvroReader, is_avro
from router.errors import InternalError, RecordUnencodable
from router.formats.schema import ColumnSchema, TableSchema

TOPIC = "app.public.t"
SOURCE = {"db": "shop", "schema": "public", "table": "t", "lsn": 5, "commit_lsn": 6, "seq": 0,
          "xid": 9, "commit_time": "2024-01-02T03:04:05.000001Z", "origin": None,
          "origin_lsn": None, "route": "app", "schema_id": "s1"}


def col(name, type_, key=False, precision=None, scale=None, element=None):
    return ColumnSchema(name, type_, 0, key=key, precision=precision, scale=scale,
                        element=element)


def table(*columns, key=("id",), schema_id="s1"):
    return TableSchema(schema_id, "public", "t", tuple(columns), tuple(key), "d")


def record(op="c", before=None, after=None, key=None, topic=TOPIC, **extra):
    value = {"op": op, "before": before, "after": after, "source": SOURCE, "ts_ms": 17, **extra}
    return (topic, None if key is None else msgspec.json.encode(key),
            msgspec.json.encode(value), None)


class Registry:
    """Ids by (subject, schema text), as a registry hands them out."""

    def __init__(self):
        self.ids: dict[tuple[str, str], int] = {}
        self.texts: dict[int, str] = {}
        self.asked: list[str] = []

    def register(self, fmt: AvroFormat, subjects: list[Subject]) -> None:
        for s in subjects:
            self.asked.append(s.subject)
            sid = self.ids.setdefault((s.subject, s.schema), len(self.ids) + 1)
            self.texts[sid] = s.schema
            fmt.set_id(s, sid)

    def read(self, data: bytes):
        sid, body = split_header(data)
        schema = fastavro.parse_schema(json.loads(self.texts[sid]))
        stream = io.BytesIO(body)
        datum = fastavro.schemaless_reader(stream, schema)
        assert stream.read() == b"", "trailing bytes after the datum"
        return datum


def convert(fmt, reg, records):
    try:
        return fmt.convert_all(records)
    except SchemasNeeded as need:
        reg.register(fmt, need.subjects)
    return fmt.convert_all(records)


@pytest.fixture
def fmt():
    return AvroFormat()


@pytest.fixture
def reg():
    return Registry()


CORPUS = [
    # (column, JSON value, datum fastavro reads back)
    (col("b", "bool"), True, True),
    (col("i2", "int2"), -32768, -32768),
    (col("i4", "int4"), 2147483647, 2147483647),
    (col("i8", "int8"), -9223372036854775808, -9223372036854775808),
    (col("o", "oid"), 4294967295, 4294967295),
    (col("f4", "float4"), 1.5, 1.5),
    (col("f8", "float8"), -2.25e300, -2.25e300),
    (col("f8n", "float8"), "NaN", None),
    (col("n", "numeric", precision=10, scale=2), "-12345678.90", Decimal("-12345678.90")),
    (col("nneg", "numeric", precision=5, scale=-2), "1234500", Decimal("1234500")),
    (col("nnan", "numeric", precision=5, scale=2), "NaN", None),
    (col("v", "numeric"), "-0.00123", {"scale": 5, "value": (-123).to_bytes(1, "big",
                                                                           signed=True)}),
    (col("vinf", "numeric"), "Infinity", None),
    (col("n40", "numeric", precision=40, scale=5), "12345678901234567890123456789012345.12345",
     Decimal("12345678901234567890123456789012345.12345")),  # beyond Python's 28 digits
    (col("v40", "numeric"), "-123456789012345678901234567890.5",
     {"scale": 1, "value": (-1234567890123456789012345678905).to_bytes(13, "big", signed=True)}),
    (col("t", "text"), "hé \u2603", "hé \u2603"),
    (col("vc", "varchar", precision=3), "abc", "abc"),
    (col("by", "bytea"), "\\x00ff10", b"\x00\xff\x10"),
    (col("d", "date"), "2024-02-29", dt.date(2024, 2, 29)),
    (col("dinf", "date"), "infinity", None),
    (col("ts", "timestamp"), "2024-01-02 03:04:05.123456",
     dt.datetime(2024, 1, 2, 3, 4, 5, 123456)),
    (col("ts3", "timestamp", precision=3), "1969-12-31 23:59:59.999",
     dt.datetime(1969, 12, 31, 23, 59, 59, 999000)),
    (col("tz", "timestamptz"), "2024-01-02 03:04:05.5+02",
     dt.datetime(2024, 1, 2, 1, 4, 5, 500000, tzinfo=dt.timezone.utc)),
    (col("tz30", "timestamptz"), "2024-01-02 03:04:05+05:30",
     dt.datetime(2024, 1, 1, 21, 34, 5, tzinfo=dt.timezone.utc)),
    (col("tzinf", "timestamptz"), "-infinity", None),
    (col("tm", "time"), "13:14:15.000016", dt.time(13, 14, 15, 16)),
    (col("tm3", "time", precision=3), "13:14:15.5", dt.time(13, 14, 15, 500000)),
    (col("ttz", "timetz"), "13:14:15+02", "13:14:15+02"),
    (col("u", "uuid"), "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
     __import__("uuid").UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")),
    (col("j", "jsonb"), '{"a": [1, 2]}', '{"a": [1, 2]}'),
    (col("iv", "interval"), "1 day 02:00:00", "1 day 02:00:00"),
    (col("e", "mood"), "happy", "happy"),
    (col("ai", "_int4", element="int4"), "{1,NULL,-3}", [1, None, -3]),
    (col("at", "_text", element="text"), '{"a b",NULL,"{x}"}', ["a b", None, "{x}"]),
    (col("ab", "_bool", element="bool"), "{t,f}", [True, False]),
    (col("ae", "_int8", element="int8"), "{}", []),
    (col("an", "_numeric", element="numeric"), "{1.5,NaN}",
     [{"scale": 1, "value": b"\x0f"}, None]),
]


def test_every_type_of_the_corpus_reads_back(fmt, reg):
    columns = [col("id", "int8", key=True)] + [c for c, _, _ in CORPUS]
    fmt.learn(table(*columns))
    after = {"id": 1, **{c.name: v for c, v, _ in CORPUS}}
    [out] = convert(fmt, reg, [record(after=after, key={"id": 1})])
    value = reg.read(out[2])
    assert value["after"] == {"id": 1, **{c.name: want for c, _, want in CORPUS}}
    assert (value["before"], value["op"], value["ts_ms"], value["source"]) == (
        None, "c", 17, SOURCE)
    assert reg.read(out[1]) == {"id": 1}


def test_connect_names_agree_with_the_logical_types_avro_data_reads(fmt, reg):
    """AvroData (Confluent's and Apicurio's converters) reads Avro's date, time-millis and
    timestamp-millis as Kafka Connect's Date, Time and Timestamp, and refuses a schema whose
    connect.name says otherwise ("Mismatched names"); the other temporal types are plain
    ints and longs there and keep Debezium's names."""
    types = {"d": ("date", None), "tm3": ("time", 3), "tz3": ("timestamptz", 3),
             "ts3": ("timestamp", 3), "ts": ("timestamp", None), "tz": ("timestamptz", None),
             "tm": ("time", None)}
    fmt.learn(table(col("id", "int8", key=True),
                    *(col(n, t, precision=p) for n, (t, p) in types.items())))
    [out] = convert(fmt, reg, [record(after={"id": 1}, key={"id": 1})])
    value = json.loads(reg.texts[split_header(out[2])[0]])
    fields = {f["name"]: f["type"][1] for f in value["fields"][0]["type"][1]["fields"]}
    assert {n: (fields[n]["logicalType"], fields[n]["connect.name"]) for n in types} == {
        "d": ("date", "org.apache.kafka.connect.data.Date"),
        "tm3": ("time-millis", "org.apache.kafka.connect.data.Time"),
        "tz3": ("timestamp-millis", "org.apache.kafka.connect.data.Timestamp"),
        "ts3": ("local-timestamp-millis", "io.debezium.time.Timestamp"),
        "ts": ("local-timestamp-micros", "io.debezium.time.MicroTimestamp"),
        "tz": ("timestamp-micros", "io.debezium.time.MicroTimestamp"),
        "tm": ("time-micros", "io.debezium.time.MicroTime")}


def test_nulls_are_nulls(fmt, reg):
    columns = [col("id", "int8", key=True)] + [c for c, _, _ in CORPUS]
    fmt.learn(table(*columns))
    [out] = convert(fmt, reg, [record(after={"id": 2}, key={"id": 2})])
    assert reg.read(out[2])["after"] == {"id": 2, **{c.name: None for c, _, _ in CORPUS}}


@pytest.mark.parametrize("n", [0, 1, -1, 63, 64, -64, -65, 2**31 - 1, -2**31, 2**63 - 1,
                               -2**63, 300, 8191, 8192])
def test_longs_encode_as_fastavro_encodes_them(n, fmt, reg):
    fmt.learn(table(col("id", "int8", key=True)))
    [out] = convert(fmt, reg, [record(after={"id": n}, key={"id": n})])
    sid, body = split_header(out[1])
    expect = io.BytesIO()
    fastavro.schemaless_writer(expect, fastavro.parse_schema(json.loads(reg.texts[sid])),
                               {"id": n})
    assert body == expect.getvalue()


def test_schema_ids_are_asked_for_once_per_subject_and_schema(fmt, reg):
    fmt.learn(table(col("id", "int8", key=True), col("x", "text")))
    recs = [record(after={"id": i, "x": "a"}, key={"id": i}) for i in range(3)]
    with pytest.raises(SchemasNeeded) as need:
        fmt.convert_all(recs)
    assert [s.subject for s in need.value.subjects] == [f"{TOPIC}-value", f"{TOPIC}-key"]
    reg.register(fmt, need.value.subjects)
    out = fmt.convert_all(recs)
    out += fmt.convert_all(recs)  # no SchemasNeeded again
    assert len(out) == 6 and reg.asked == [f"{TOPIC}-value", f"{TOPIC}-key"]
    assert {split_header(r[2])[0] for r in out} == {1} and {split_header(r[1])[0]
                                                             for r in out} == {2}


def test_a_new_layout_needs_a_new_id_and_old_records_keep_theirs(fmt, reg):
    fmt.learn(table(col("id", "int8", key=True)))
    fmt.learn(table(col("id", "int8", key=True), col("added", "text"), schema_id="s2"))
    old = convert(fmt, reg, [record(after={"id": 1}, key={"id": 1})])
    src2 = dict(SOURCE, schema_id="s2")
    new = ("app.public.t", b'{"id":2}', msgspec.json.encode(
        {"op": "c", "before": None, "after": {"id": 2, "added": "x"}, "source": src2,
         "ts_ms": 1}), None)
    with pytest.raises(SchemasNeeded) as need:
        fmt.convert_all([new])
    assert [s.subject for s in need.value.subjects] == [f"{TOPIC}-value"]  # key unchanged
    reg.register(fmt, need.value.subjects)
    [out] = fmt.convert_all([new])
    assert split_header(out[2])[0] != split_header(old[0][2])[0]
    assert split_header(out[1])[0] == split_header(old[0][1])[0]
    assert reg.read(out[2])["after"] == {"id": 2, "added": "x"}


def test_a_key_change_is_a_delete_and_a_create(fmt, reg):
    fmt.learn(table(col("id", "int8", key=True), col("x", "text")))
    out = convert(fmt, reg, [record("u", before={"id": 1, "x": "a"}, after={"id": 2, "x": "b"},
                                    key={"id": 2})])
    assert [reg.read(r[1]) for r in out] == [{"id": 1}, {"id": 2}]
    values = [reg.read(r[2]) for r in out]
    assert [(v["op"], v["before"], v["after"], v["key_change"]) for v in values] == [
        ("d", {"id": 1, "x": "a"}, None, "delete_old"),
        ("c", {"id": 1, "x": "a"}, {"id": 2, "x": "b"}, "create_new")]
    reader = AvroReader()
    for sid, text in reg.texts.items():
        reader.learn(sid, text)
    # read back for the applier: one update again, as the JSON format has it
    assert reader.envelope(out[0][2], updates=True) is None
    again = reader.envelope(out[1][2], updates=True)
    assert (again["op"], again["before"], again["after"]) == (
        "u", {"id": 1, "x": "a"}, {"id": 2, "x": "b"})
    assert reader.envelope(out[0][2])["op"] == "d"


def test_unchanged_toast_has_the_placeholder_where_the_type_holds_it(fmt, reg):
    fmt.learn(table(col("id", "int8", key=True), col("t", "text"), col("b", "bytea"),
                    col("j", "jsonb"), col("a", "_int4", element="int4")))
    [out] = convert(fmt, reg, [record("u", after={"id": 1}, key={"id": 1},
                                      unchanged_toast=["t", "b", "j", "a"])])
    value = reg.read(out[2])
    ph = "__debezium_unavailable_value"
    assert value["after"] == {"id": 1, "t": ph, "b": ph.encode(), "j": ph, "a": None}
    assert value["unchanged_toast"] == ["t", "b", "j", "a"]


def test_truncate_delete_and_keyless_tables(fmt, reg):
    fmt.learn(table(col("x", "text"), key=()))
    out = convert(fmt, reg, [
        record("d", before={"x": "gone"}),
        record("t", truncate={"cascade": True, "restart_identity": False})])
    assert [r[1] for r in out] == [None, None]
    d, t = (reg.read(r[2]) for r in out)
    assert (d["op"], d["before"], d["after"]) == ("d", {"x": "gone"}, None)
    assert (t["op"], t["truncate"]) == ("t", {"cascade": True, "restart_identity": False})


def test_logical_messages_have_their_own_schema(fmt, reg):
    src = dict(SOURCE, schema=None, table=None, schema_id=None)
    rec = ("msgs", None, msgspec.json.encode(
        {"op": "m", "before": None, "after": None, "source": src, "ts_ms": 3,
         "message": {"prefix": "p", "transactional": True, "content": "aGk="}}), None)
    [out] = convert(fmt, reg, [rec])
    assert reg.asked == ["msgs-value"] and out[1] is None
    v = reg.read(out[2])
    assert (v["op"], v["message"], v["source"]) == (
        "m", {"prefix": "p", "transactional": True, "content": b"hi"}, src)


def test_what_avro_cannot_hold_stops_with_the_column_named(fmt, reg):
    fmt.learn(table(col("id", "int8", key=True), col("m", "_int4", element="int4")))
    with pytest.raises(RecordUnencodable, match=r"public\.t: column 'm' \(_int4\).*"
                                                r"multi-dimensional"):
        convert(fmt, reg, [record(after={"id": 1, "m": "{{1,2},{3,4}}"}, key={"id": 1})])


def test_a_record_naming_an_unpublished_schema_is_an_internal_error(fmt):
    with pytest.raises(InternalError, match="not published"):
        fmt.convert_all([record(after={"id": 1})])


@pytest.mark.parametrize("naming, kind, want", [
    ("topic", "value", "a.b-value"), ("topic", "key", "a.b-key"),
    ("record", "value", "a.b.Envelope"), ("topic_record", "value", "a.b-a.b.Envelope")])
def test_subject_naming(naming, kind, want):
    assert subject_name(naming, "a.b", kind, "a.b." + ("Envelope" if kind == "value"
                                                       else "Key")) == want


@pytest.mark.parametrize("topic, ns", [("app.public.t", "app.public.t"),
                                       ("my-app.1st.t$x", "my_app._1st.t_x")])
def test_topics_become_valid_namespaces(topic, ns, reg):
    assert avro_namespace(topic) == ns
    fmt = AvroFormat()
    fmt.learn(table(col("id", "int8", key=True)))
    [out] = convert(fmt, reg, [record(after={"id": 1}, key={"id": 1}, topic=topic)])
    assert reg.read(out[2])["after"] == {"id": 1}
    assert json.loads(reg.texts[split_header(out[2])[0]])["namespace"] == ns


def test_unknown_subject_naming_is_refused():
    with pytest.raises(ValueError, match="subject naming"):
        AvroFormat("bogus")


# -- reading back as the JSON envelope (router.formats.avro_read)
# ------------------------------------


def test_records_read_back_as_the_json_envelope(fmt, reg):
    columns = [col("id", "int8", key=True)] + [c for c, _, _ in CORPUS]
    fmt.learn(table(*columns))
    after = {"id": 1, **{c.name: v for c, v, _ in CORPUS}}
    [out] = convert(fmt, reg, [record(after=after, key={"id": 1})])
    reader = AvroReader()
    for sid, text in reg.texts.items():
        reader.learn(sid, text)
    assert is_avro(out[2]) and not is_avro(b'{"op":"c"}')
    env = msgspec.json.decode(reader.to_json(out[2]))
    assert reader.key(out[1]) == {"id": 1}
    got = env["after"]
    assert (env["op"], env["source"], env["ts_ms"]) == ("c", SOURCE, 17)
    assert got["n"] == "-12345678.90" and got["nneg"] == "1234500"
    assert got["v"] == "-0.00123" and got["by"] == "\\x00ff10"
    assert got["n40"] == "12345678901234567890123456789012345.12345"
    assert got["v40"] == "-123456789012345678901234567890.5"
    assert got["ts"] == "2024-01-02 03:04:05.123456"
    assert got["tz"] == "2024-01-02 01:04:05.500000+00:00"
    assert got["d"] == "2024-02-29" and got["tm"] == "13:14:15.000016"
    assert got["ai"] == '{"1",NULL,"-3"}' and got["at"] == '{"a b",NULL,"{x}"}'
    assert got["ab"] == '{"t","f"}' and got["ae"] == "{}"
    assert got["u"] == "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
    assert (got["i8"], got["f8"], got["b"], got["f8n"], got["nnan"]) == (
        -9223372036854775808, -2.25e300, True, None, None)


def test_unchanged_toast_columns_are_left_out_of_after_again(fmt, reg):
    fmt.learn(table(col("id", "int8", key=True), col("t", "text")))
    [out] = convert(fmt, reg, [record("u", after={"id": 1}, key={"id": 1},
                                      unchanged_toast=["t"])])
    reader = AvroReader()
    for sid, text in reg.texts.items():
        reader.learn(sid, text)
    env = reader.envelope(out[2])
    assert env["after"] == {"id": 1} and env["unchanged_toast"] == ["t"]


def test_a_body_that_does_not_decode_is_a_decode_error(fmt, reg):
    from router.errors import DecodeError
    fmt.learn(table(col("id", "int8", key=True), col("t", "text")))
    [out] = convert(fmt, reg, [record(after={"id": 1, "t": "x" * 50}, key={"id": 1})])
    reader = AvroReader()
    for sid, text in reg.texts.items():
        reader.learn(sid, text)
    with pytest.raises(DecodeError, match="does not decode"):
        reader.envelope(out[2][:20])
    with pytest.raises(DecodeError, match="not fetched"):
        reader.envelope(b"\x00\x00\x00\x00\x63" + out[2][5:])


def test_transaction_metadata_stays_json(fmt):
    meta = ("tx", b'"1:2"', b'{"status":"BEGIN","id":"1:2","event_count":null}', None)
    assert fmt.convert_all([meta]) == [meta]


def test_columns_whose_names_avro_refuses_get_valid_field_names(fmt, reg):
    cols = [col("my id", "int8", key=True), col("1st", "text"), col("my-id", "text"),
            col("my_id", "text"), col("été", "int4")]
    fmt.learn(table(*cols, key=("my id",)))
    row = {"my id": 1, "1st": "a", "my-id": "b", "my_id": "c", "été": 5}
    [out] = convert(fmt, reg, [record(after=row, key={"my id": 1})])
    value_schema = json.loads(reg.texts[split_header(out[2])[0]])
    fields = value_schema["fields"][0]["type"][1]["fields"]
    assert [(f["name"], f.get("pgrouter.column")) for f in fields] == [
        ("my_id_2", "my id"), ("_1st", "1st"), ("my_id_3", "my-id"), ("my_id", None),
        ("_t_", "été")]
    assert reg.read(out[2])["after"] == {"my_id_2": 1, "_1st": "a", "my_id_3": "b",
                                         "my_id": "c", "_t_": 5}
    reader = AvroReader()
    for sid, text in reg.texts.items():
        reader.learn(sid, text)
    assert reader.envelope(out[2])["after"] == row  # the columns' own names again
    assert reader.key(out[1]) == {"my id": 1}
