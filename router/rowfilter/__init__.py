"""Publication row filters (``CREATE PUBLICATION ... FOR TABLE t WHERE (expr)``), evaluated
client-side with PostgreSQL's semantics.

A filter compiles once: parse (``parser``) → check against what PostgreSQL allows in a
publication filter and resolve types (``check``) → fold constants and build closures
(``compile``). Rows are evaluated as pgoutput sends them: text-format values, ``None`` for NULL.

Limitations (also in ``types``): text compares with the "C" collation (PostgreSQL uses the
column's collation); timestamptz constants without a zone are read as UTC (the router connects
with ``TimeZone=UTC``, so PostgreSQL reads them the same way); regular expressions, LIKE ...
ESCAPE, SIMILAR TO, json/bytea/interval/time operators and casts are refused at compile time.
"""

from __future__ import annotations

from typing import Sequence

import msgspec

from .errors import FilterEvaluationError

__all__ = ["ColumnType", "RowFilter", "compile_filter", "FilterEvaluationError"]


class ColumnType(msgspec.Struct, frozen=True):
    """A column of the filtered table, in row order (as the Relation message describes it)."""

    name: str
    type_oid: int
    type_modifier: int = -1


class RowFilter:
    """A compiled filter. ``evaluate`` returns True/False/None (NULL); ``matches`` is what
    pgoutput does with it: only True publishes the row."""

    __slots__ = ("sql", "columns_used", "_fn", "_convs", "_width", "_names")

    def __init__(self, sql: str, columns: Sequence[ColumnType], fn, used: dict[int, object]):
        self.sql = sql
        self._fn = fn
        self._width = len(columns)
        self._names = [c.name for c in columns]
        self.columns_used = frozenset(self._names[i] for i in used)
        from . import types as _types  # the compiler loads when a filter compiles: not before
        # text-like columns need no conversion; everything else is parsed once per row
        parsers = {i: _types.PARSERS[_types.BY_OID[columns[i].type_oid]] for i in used}
        self._convs = tuple((i, p) for i, p in sorted(parsers.items())
                            if p is not _types.PARSERS[_types.TEXT])

    def evaluate(self, row: Sequence[str | None]) -> bool | None:
        if len(row) != self._width:
            raise FilterEvaluationError(
                f"row has {len(row)} values, the filter was compiled for {self._width} columns")
        vals = row
        if self._convs:
            vals = list(row)
            for i, parse in self._convs:
                raw = vals[i]
                if raw is not None:
                    try:
                        vals[i] = parse(raw)
                    except (ValueError, OverflowError, ArithmeticError) as exc:
                        raise FilterEvaluationError(
                            f"column {self._names[i]}: invalid text value {raw!r}",
                            sqlstate="22P02") from exc
        return self._fn(vals)

    def matches(self, row: Sequence[str | None]) -> bool:
        return self.evaluate(row) is True

    def __repr__(self) -> str:
        return f"RowFilter({self.sql!r})"


def compile_filter(sql: str, columns: Sequence[ColumnType]) -> RowFilter:
    """Compile ``sql`` (the expression inside ``WHERE (...)``, or what ``pg_get_expr`` prints)
    for a table with ``columns``. Raises ``router.errors.FilterError`` with line and column."""
    from . import check as _check, compile as _compile, parser as _parser
    tree = _parser.parse(sql)
    typed = _check.check(tree, sql, columns)
    used: dict[int, object] = {}
    _collect(typed, used)
    fn = _compile.compile_tree(typed, sql)
    return RowFilter(sql, columns, fn, used)


def _collect(node, used: dict) -> None:
    from . import typed as T
    if isinstance(node, T.Col):
        # the column's own type: a relabelled reference (float4 read as float8) still
        # parses its text as the column's type
        used[node.index] = node.index
        return
    for field in node.__slots__:
        value = getattr(node, field)
        if isinstance(value, T.TNode):
            _collect(value, used)
        elif isinstance(value, tuple):
            for item in value:
                if isinstance(item, T.TNode):
                    _collect(item, used)
                elif isinstance(item, tuple):
                    for sub in item:
                        if isinstance(sub, T.TNode):
                            _collect(sub, used)
