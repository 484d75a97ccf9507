"""The configuration reference (docs/configuration.md) names every key of the three config
files once, and no key the code does not have; the README's short config loads as it is."""

from __future__ import annotations

import re
import tomllib

from router.config.router import parse_config
from tests.conftest import ROOT
from tests.config_keys import all_keys

ROW = re.compile(r"^\| `(router|apply|materialize):([a-z_.]+)` \|", re.M)


def documented() -> list[tuple[str, str]]:
    return ROW.findall((ROOT / "docs" / "configuration.md").read_text())


def test_every_config_key_has_one_row_in_the_reference():
    rows = documented()
    in_code = {(file, key) for file, keys in all_keys().items() for key in keys}
    in_docs = set(rows)
    assert len(rows) == len(in_docs), "a key is documented twice"
    assert sorted(in_code - in_docs) == [], "keys without a row in docs/configuration.md"
    assert sorted(in_docs - in_code) == [], "rows in docs/configuration.md for keys the code lacks"


def test_the_readme_config_loads():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert blocks, "the README shows a config"
    for block in blocks:
        tomllib.loads(block)
        parse_config(block, source="README.md")
