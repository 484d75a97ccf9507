"""Kafka Connect itself reads pgrouter's Connect records of the edge corpus
(``test_format_edges``: BC dates, years past 9999, where int64 ends, time 24:00:00,
numeric(6,2)[] and timestamp(3)[] elements, 1100-digit numeric, a domain column) and of the
hostile corpus (``test_format_hostile``: arrays of enums and domains, domains over numeric,
varchar and a domain, json with \\u0000, bit, interval, money, bytea, oid, …): a standalone
worker whose ``JsonConverter`` (``schemas.enable=true``) parses keys and values, and Kafka's
``FileStreamSinkConnector`` writing each row as Connect holds it. Nothing of pgrouter's reads
the records: a value that does not match its schema fails the task, and each value Connect
parsed (``Decimal`` as ``BigDecimal``, Debezium's time types as their int32/int64) equals
what PostgreSQL computes.

The row of each record is taken out with Connect's own transforms (``ExtractField`` of
``after``, ``Flatten`` of the ``VariableScaleDecimal`` struct, ``Cast`` of its bytes to
base64), so the file holds one ``Struct{col=value,…}`` per record. One worker serves both
corpora."""

from __future__ import annotations

import base64
import time
from decimal import Decimal

import pytest

from devstack.connect import ConnectStandalone, file_sink
from tests.e2e import test_format_edges as edges
from tests.e2e import test_format_hostile as hostile
from tests.helpers import ROOT, Pg, read_topic, run_router, unique, write_config

pytestmark = pytest.mark.services

ROW_TRANSFORMS = {
    "transforms": "after,flat,b64",
    "transforms.after.type": "org.apache.kafka.connect.transforms.ExtractField$Value",
    "transforms.after.field": "after",
    "transforms.flat.type": "org.apache.kafka.connect.transforms.Flatten$Value",
    "transforms.flat.delimiter": "_",
    "transforms.b64.type": "org.apache.kafka.connect.transforms.Cast$Value",
}


def parse_struct(line: str, names: list[str]) -> dict[str, str]:
    """``Struct{a=1,b=x,y}`` (``Struct.toString``: fields in schema order, nulls left out)
    as {field: text}; a value runs up to the next ``,<later field>=``."""
    assert line.startswith("Struct{") and line.endswith("}"), line
    body, out, pos, present = line[7:-1], {}, 0, []
    for n in names:  # which fields are there, and where
        at = (0 if body.startswith(n + "=") else -1) if not present else \
            body.find("," + n + "=", pos)
        if at >= 0:
            present.append((n, at))
            pos = at + 1
    for i, (n, at) in enumerate(present):
        start = at + len(n) + (1 if i == 0 else 2)
        end = present[i + 1][1] if i + 1 < len(present) else len(body)
        out[n] = body[start:end]
    return out


def java_list(text: str | None, conv) -> list | None:
    if text is None:
        return None
    assert text[:1] == "[" and text[-1:] == "]", text
    items = text[1:-1].split(", ") if text != "[]" else []
    return [None if e == "null" else conv(e) for e in items]


def vsd(row: dict, col: str) -> Decimal | None:
    if f"{col}_value" not in row:
        return None
    n = int.from_bytes(base64.b64decode(row[f"{col}_value"]), "big", signed=True)
    return edges.scaled(n, int(row[f"{col}_scale"]))


def opt(conv):
    return lambda v: None if v is None else conv(v)


# how each column of the edge corpus reads back from Connect's toString
EDGE_READ = {"d": opt(int), "ts": opt(int), "ts3": opt(int), "tz": edges.iso_micros,
             "t": opt(int), "n": opt(Decimal), "an": lambda v: java_list(v, Decimal),
             "ats3": lambda v: java_list(v, int), "pos": opt(int), "cash": lambda v: v,
             "tags": lambda v: java_list(v, str)}


def wait_lines(connect: ConnectStandalone, out, n: int, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = out.read_text().splitlines() if out.exists() else []
        if len(lines) >= n:
            return lines
        failed = connect.task_failed() or not connect.alive()
        assert not failed and time.monotonic() < deadline, (
            f"{len(lines)}/{n} records in {out.name}\n" + connect.log.read_text()[-4000:])
        time.sleep(0.5)


def check_edges(pg: Pg, name: str, lines: list[str]) -> None:
    want = edges.expected_rows(pg, name)
    names = ["id", "d", "ts", "ts3", "tz", "t", "n", "an", "ats3", "v_scale", "v_value", "pos",
             "cash", "tags"]
    seen = []
    for line in lines:
        raw = parse_struct(line, names)
        got = {c: read(raw.get(c)) for c, read in EDGE_READ.items()}
        got["v"] = vsd(raw, "v")
        rid = int(raw["id"])
        assert rid in want, f"Connect read id {rid}: {line[:200]}"
        exp = dict(want[rid])
        for c in ("ts", "ts3"):  # past int64: null (Connect's int64 cannot hold it)
            exp[c] = edges.long_or_none(exp[c])
        assert got == exp, (rid, got, exp)
        seen.append(rid)
    assert sorted(seen) == sorted(want)


def test_kafka_connect_json_converter_reads_the_edge_and_hostile_corpora(
        pg_dsn, kafka_bootstrap, tmp_path):
    pg = Pg(pg_dsn)
    name = unique("edwk")
    hname = unique("hswk")
    topic, htopic, dom = f"{name}.t", f"{hname}.t", f"{name}_dom"
    routes = (edges.route(name, topic) + edges.route(hname, htopic))
    cfg = write_config(tmp_path / "r.toml", dsn=pg_dsn, slot=name,
                       publications=[name, hname], bootstrap=kafka_bootstrap, routes=routes,
                       kafka_extra=f'schema_topic = "{name}.schemas"\nformat = "connect"\n')
    out, hout = tmp_path / "edges.txt", tmp_path / "hostile.txt"
    connect = ConnectStandalone(
        ROOT / ".devstack" / "cache", tmp_path / "connect", bootstrap=kafka_bootstrap,
        topics=[topic, htopic], connectors=[
            file_sink(f"{name}-edges", [topic], out,
                      **ROW_TRANSFORMS, **{"transforms.b64.spec": "v_value:string"}),
            file_sink(f"{name}-hostile", [htopic], hout,
                      **ROW_TRANSFORMS, **{"transforms.b64.spec": hostile.CAST_SPEC})])
    try:
        edges.make_table(pg, name, dom)
        hostile.make_table(pg, hname)
        run_router(cfg)
        pg.run(f"insert into {name} select id + 100, d, ts, ts3, tz, t, n, an, ats3, v, pos, "
               f"cash, tags from {name}")
        hostile.stream_copies(pg, hname)
        run_router(cfg)
        connect.start()
        check_edges(pg, name, wait_lines(connect, out, 10, timeout=120))
        hlines = wait_lines(connect, hout, 2 * len(hostile.ROWS), timeout=60)
        records = [r["value"] for r in read_topic(kafka_bootstrap, htopic, settle=0)]
        names = [f["field"] for f in records[0]["schema"]["fields"][1]["fields"]]
        hostile.check_connect_worker(pg, hname, [parse_struct(x, hostile.flat_names(names))
                                                 for x in hlines])
    finally:
        connect.stop()
        edges.drop_table(pg, name, dom, name)
        hostile.drop_table(pg, hname)
        pg.close()
