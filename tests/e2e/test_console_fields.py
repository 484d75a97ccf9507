"""docs/console.md's field table against a real router's ``/api/status``: every field the
table names is in every object it describes (each route, each of a route's tables, each job
and problem), and the API has no field the table does not name. The router has a table route
and a publication route (``routes[].tables[].publication`` is there for both: null for the
table route), an initial snapshot (``jobs[]``), a warning (``problems[]``: an existing topic
whose partition count differs from ``topic_settings``) and actions on (``csrf``).

The table's convention (docs/console.md): a row names a top-level field (several for leaves);
its meaning lists the object's fields as comma-separated items starting with a backticked
name; ``x[]`` is a list of objects whose fields are in the parentheses after it; a leading
parenthesised note qualifies the row (``kind = apply`` only, with actions on only).
"""

from __future__ import annotations

import json
import re

import pytest

from router.snapshot.signals import SETUP_SQL
from tests.e2e.console_browser import TOKEN, free_port, http, stop, wait_for
from tests.e2e.guarantee import delete_topics
from tests.e2e.sources import new_table, source_config
from tests.helpers import ROOT, start_router

pytestmark = pytest.mark.services

DOC = ROOT / "docs" / "console.md"
NAME = re.compile(r"`([a-z_]+(?:\[\])?)`")


def _split(text: str, sep: str = ",") -> list[str]:
    """``text`` cut at ``sep`` outside parentheses and backticks."""
    out, depth, quoted, start = [], 0, False, 0
    for i, c in enumerate(text):
        if c == "`":
            quoted = not quoted
        elif not quoted and c == "(":
            depth += 1
        elif not quoted and c == ")":
            depth -= 1
        elif not quoted and depth == 0 and c == sep:
            out.append(text[start:i])
            start = i + 1
    return out + [text[start:]]


def _note(text: str) -> tuple[str, str]:
    """(the leading parenthesised note, the rest)."""
    text = text.strip()
    if not text.startswith("("):
        return "", text
    depth = 0
    for i, c in enumerate(text):
        depth += (c == "(") - (c == ")")
        if depth == 0:
            return text[1:i], text[i + 1:]
    raise AssertionError(f"unbalanced parentheses: {text!r}")


def fields(text: str) -> dict[str, dict]:
    """field name -> its fields (``x[]``: the parenthesised fields of each element)."""
    out: dict[str, dict] = {}
    for item in _split(_note(text)[1]):
        m = NAME.match(item.strip())
        if not m:
            continue
        name, rest = m.group(1), item.strip()[m.end():].strip()
        out[name] = fields(rest[1:rest.rindex(")")]) if name.endswith("[]") and \
            rest.startswith("(") else {}
    return out


def documented() -> tuple[dict[str, dict], dict[str, str]]:
    """(top-level field -> its fields, top-level field -> its row's note) of the table in
    docs/console.md's ``/api/status`` section."""
    section = DOC.read_text().split("## `/api/status`", 1)[1].split("\n## ", 1)[0]
    top, notes = {}, {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first, meaning = line.strip().strip("|").split("|", 1)
        names = NAME.findall(first)
        for name in names:
            top[name] = fields(meaning) if len(names) == 1 else {}
            notes[name.removesuffix("[]")] = _note(meaning)[0]
    return top, notes


def walk(spec: dict[str, dict], value: dict, path: str, seen: set[str]) -> list[str]:
    """What differs between ``spec`` and the object ``value``; ``seen``: the documented
    paths checked against at least one value."""
    wrong = [f"{path}{k}: not documented" for k in value
             if k not in {n.removesuffix("[]") for n in spec}]
    for name, sub in spec.items():
        key = name.removesuffix("[]")
        if key not in value:
            wrong.append(f"{path}{key}: documented, missing")
            continue
        seen.add(f"{path}{name}")
        if not sub or value[key] is None:
            continue
        items = value[key] if name.endswith("[]") else [value[key]]
        for item in items:
            wrong += walk(sub, item, f"{path}{name}.", seen)
    return wrong


def paths(spec: dict[str, dict], prefix: str = "") -> set[str]:
    return {p for name, sub in spec.items()
            for p in {prefix + name} | paths(sub, f"{prefix}{name}.")}


def test_the_table_is_read_as_documented():
    top, notes = documented()
    assert top["routes[]"]["tables[]"] == {"table": {}, "row_filter": {}, "columns": {},
                                           "publication": {}}
    assert "problem" in top["state"] and "history" in top["slot"]
    assert set(top["problems[]"]) == {"ts", "level", "logger", "msg", "fields"}
    assert "kind = apply" in notes["apply"] and notes["csrf"]
    assert top["config"] == {} and top["kind"] == {}


@pytest.fixture
def router(pg_dsn, kafka_bootstrap, tmp_path):
    pg, name = new_table(pg_dsn, "cf", "id int primary key, v int")
    pg.run(f"insert into {name} select i, i from generate_series(1, 50) i")
    pg.run(f"create publication {name} for table {name}")
    pg.run(f"create publication {name}_f for table {name} (id, v) where (v > 10)")
    topics = [f"{name}_t", f"{name}_p"]
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topics[0], 1, 1)])[topics[0]].result(timeout=30)
    port = free_port()
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name, routes=f"""
[[routes]]
name = "{name}_t"
tables = ["public.{name}"]
topic = "{topics[0]}"
topic_settings = {{ partitions = 2 }}

[[routes]]
name = "{name}_p"
publication = "{name}_f"
topic = "{topics[1]}"
""", extra=f"""
[metrics]
listen = "127.0.0.1:{port}"

[console]
token = "{TOKEN}"
allow_actions = true
""")
    proc = start_router(cfg, tmp_path / "router.log")
    try:
        wait_for(lambda: http(f"http://127.0.0.1:{port}/readyz")[0] == 200,
                 "the router streaming", 60)
        pg.run(f"insert into {name} values (100, 100)")
        # a refused signal (an unknown route): signals[] then holds every documented field
        for stmt in SETUP_SQL:
            pg.run(stmt)
        pg.run("insert into pgrouter.signals (route, \"table\", slot) "
               f"values ('no_such_route', 'public.{name}', '{name}')")
        wait_for(lambda: json.loads(http(f"http://127.0.0.1:{port}/api/status")[1])["signals"],
                 "the signal in /api/status", 60)
        yield f"http://127.0.0.1:{port}", name
    finally:
        stop(proc)
        pg.drop_slot(name)
        pg.run(f"drop publication {name}, {name}_f")
        pg.run(f"drop table {name}")
        pg.close()
        delete_topics(kafka_bootstrap, topics)


def test_api_status_has_every_documented_field_and_no_other(router):
    url, name = router

    def status():
        doc = json.loads(http(url + "/api/status")[1])
        sent = {r["name"]: r["topics"] for r in doc["routes"]}
        return doc if all(sent.values()) and doc["jobs"] and doc["problems"] else None

    doc = wait_for(status, "records in both routes, a snapshot job and a warning", 60)
    top, notes = documented()
    run = {k: v for k, v in top.items() if "kind = apply" not in notes[k.removesuffix("[]")]}
    seen: set[str] = set()
    assert walk(run, doc, "", seen) == []
    # every documented field met at least one value (ha is null without [ha] enabled)
    assert {p for p in paths(run) - seen if not p.startswith("ha.")} == set()
    tables = {r["name"]: r["tables"] for r in doc["routes"]}
    assert tables[f"{name}_t"] == [{"table": f"public.{name}", "row_filter": None,
                                    "columns": [], "publication": None}]
    assert tables[f"{name}_p"] == [{"table": f"public.{name}", "row_filter": "(v > 10)",
                                    "columns": ["id", "v"], "publication": f"{name}_f"}]
