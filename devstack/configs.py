"""Config files for the benches and the tests: TOML text from tables of keys, so a caller
names its settings instead of writing the file's lines again.

    toml({"source": {"dsn": dsn, "slot": slot}, "routes": [{"name": "r", "tables": [t]}]})

A table's keys are written as JSON writes their values (strings, numbers, booleans, lists of
them; TOML reads them alike); a key whose value is None is left out; a list of tables is an
array of tables (``[[routes]]``)."""

from __future__ import annotations

import json


def toml(tables: dict) -> str:
    out = []
    for name, body in tables.items():
        for keys in body if isinstance(body, list) else [body]:
            out.append(f"[[{name}]]" if isinstance(body, list) else f"[{name}]")
            out += [f"{key} = {json.dumps(value)}" for key, value in keys.items()
                    if value is not None]
    return "\n".join(out) + "\n"
