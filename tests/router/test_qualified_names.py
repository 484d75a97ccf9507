"""``schema.table`` names as written in configs and on the command line (``tables = [...]``,
``--table``, the applier's ``progress_table`` and ``target.tables``): the first dot splits
unquoted names as before, and a double-quoted part names a schema (or table) holding dots
or starting with a quote."""

from __future__ import annotations

import pytest

from actors.apply.target import progress_table_sql
from router.config.applier import parse_apply_config, table_map
from router.config.router import parse_config, qualified
from router.errors import ConfigError
from router.postgres.identifiers import split_qualified, unparse_qualified
from tests.helpers import APPLY_CONFIG, config_head

NAMES = [
    ("t", ("public", "t")),
    ("s.t", ("s", "t")),
    ("public.dot.ted", ("public", "dot.ted")),          # unquoted: the first dot splits
    ('public.quo"te', ("public", 'quo"te')),
    ('"My Schema.x"."Tab""le \'x\'"', ("My Schema.x", "Tab\"le 'x'")),
    ('"my.schema".t', ("my.schema", "t")),
    ('"a.b"', ("public", "a.b")),
    ('"x"."new\nline"', ("x", "new\nline")),
    ('"ünï.😀"."""q"', ("ünï.😀", '"q')),
]


@pytest.mark.parametrize("text, expected", NAMES)
def test_split_and_back(text, expected):
    assert split_qualified(text) == expected
    assert qualified(text) == expected
    assert split_qualified(unparse_qualified(*expected)) == expected


@pytest.mark.parametrize("text", ["", ".t", "s.", '"x', '"".t', '"a"b.c', '"a"."b"c',
                                  's.""'])
def test_malformed_names_are_one_line(text):
    with pytest.raises(ValueError):
        split_qualified(text)


CFG = config_head("postgresql://h/db") + """[[routes]]
name = "r"
tables = [{tables}]
"""


def test_config_tables_take_quoted_schemas():
    cfg = parse_config(CFG.format(tables="'\"my.schema\".\"T 1\"', 'public.dot.ted'"))
    assert [qualified(t) for t in cfg.routes[0].tables] == [("my.schema", "T 1"),
                                                            ("public", "dot.ted")]
    with pytest.raises(ConfigError) as info:
        parse_config(CFG.format(tables="'\"my.schema'"))
    assert info.value.path == "routes[0].tables[0]" and "double quote" in str(info.value)


APPLY = APPLY_CONFIG


def test_apply_progress_table_and_table_map_with_dots_and_quotes():
    cfg = parse_apply_config(APPLY + 'progress_table = \'"ops.v2"."progress ""x"""\'\n'
                             '[target.tables]\n'
                             '\'"my.schema".t\' = \'"other.schema"."T"\'\n'
                             '"public.dot.ted" = "public.t2"\n')
    assert progress_table_sql(cfg.target) == '"ops.v2"."progress ""x"""'
    assert table_map(cfg.target) == {("my.schema", "t"): ("other.schema", "T"),
                                     ("public", "dot.ted"): ("public", "t2")}
    for bad in ['progress_table = "nodot"\n', 'progress_table = \'"ops.v2\'\n']:
        with pytest.raises(ConfigError) as info:
            parse_apply_config(APPLY + bad)
        assert info.value.path == "target.progress_table", str(info.value)
