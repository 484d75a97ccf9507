"""The one parser of PostgreSQL array literals (``router.postgres.arrays``), against what
PostgreSQL's ``array_out`` writes and ``array_in`` accepts."""

from __future__ import annotations

import pytest

from router.postgres.arrays import NestedArray, array_items


@pytest.mark.parametrize("text, items", [
    ("{}", []), ("{ }", []), ("{1,2,3}", ["1", "2", "3"]), ("{NULL,null,a}", [None, None, "a"]),
    ('{"a,b","c\\\\d","NULL"}', ["a,b", "c\\d", "NULL"]), ("[0:1]={7,8}", ["7", "8"]),
    ('{ a , "b c" }', ["a", "b c"]), ('{"x\\"y"}', ['x"y']), ("{a\\,b}", ["a,b"]),
    ('{"2024-01-02 03:04:05+00"}', ["2024-01-02 03:04:05+00"]),
])
def test_elements(text, items):
    assert array_items(text) == items


def test_nested_arrays_as_text_or_refused():
    assert array_items("{{1,2},{3,4}}", nested=True) == ["{1,2}", "{3,4}"]
    with pytest.raises(NestedArray):
        array_items("{{1,2},{3,4}}")


@pytest.mark.parametrize("text", ["", "1,2", "{1,2", '{"a}', "{a,,b}", '{a"b}', "{1}x",
                                  "{{1,2}", "{a b c"])
def test_malformed_literals_are_refused(text):
    with pytest.raises(ValueError):
        array_items(text, nested=True)
