"""Check a parsed row filter against what PostgreSQL allows and resolve its types.

PostgreSQL (``publicationcmds.c``, ``check_simple_rowfilter_expr_walker``) allows only simple
expressions: columns (no system columns), constants, built-in operators and immutable built-in
functions over built-in types and collations, AND/OR/NOT, IS [NOT] NULL, IS [NOT]
TRUE/FALSE/UNKNOWN, CASE, COALESCE, NULLIF, GREATEST/LEAST, ``op ANY/ALL (array)``, ARRAY[...].
No subqueries, aggregates, window or set-returning functions, no casts through text.

Operator resolution follows PostgreSQL for the supported types: an untyped literal takes the
other operand's type; numbers widen int2 → int4 → int8 → numeric → float8 (float4 op float4
stays float4); text-like operands compare as text unless both are bpchar; date widens to
timestamp. Anything else is refused with a ``FilterError`` naming the construct and its
line/column.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Sequence

from . import casts, lexer, typed as T
from . import nodes as N
from .operators import _MUTABLE_DETAIL, _Operators
from .types import (VARCHAR, BOOL, BPCHAR, DATE, FLOAT4, FLOAT8, INTS, INT4, INT8, NUMERIC, STRINGS,
                    TEXT, TIMESTAMP, TIMESTAMPTZ, UNKNOWN, PgType, array_of, parse_array,
                    parse_text, resolve_type_name, INT_RANGE)

SYSTEM_COLUMNS = {"ctid", "xmin", "xmax", "cmin", "cmax", "tableoid", "oid"}
_SQL_VALUE_FUNCTIONS = {"current_timestamp", "current_date", "current_time", "localtime",
                        "localtimestamp", "current_user", "session_user", "user", "current_role",
                        "current_catalog", "current_schema"}


def check(tree: N.Node, text: str, columns: Sequence) -> T.TNode:
    node = _Binder(text, columns).top(tree)
    return node


class _Binder(_Operators):
    def __init__(self, text: str, columns: Sequence):
        self.text = text
        self.columns = {c.name: (i, c) for i, c in enumerate(columns)}

    def err(self, pos: int, message: str):
        return lexer.error(self.text, pos, message)

    def top(self, tree: N.Node) -> T.TNode:
        node = self.bind(tree)
        return self.as_bool(node, "WHERE")

    # --- coercion ------------------------------------------------------------------------

    def as_bool(self, node: T.TNode, where: str) -> T.TNode:
        if node.type is BOOL:
            return node
        if node.type is UNKNOWN:
            return self.coerce(node, BOOL)
        raise self.err(node.pos, f"argument of {where} must be type boolean, not type "
                                 f"{node.type.display}")

    def coerce(self, node: T.TNode, dst: PgType, typmod: int = -1, *, explicit=False) -> T.TNode:
        src = node.type
        if src is UNKNOWN and isinstance(node, T.Lit):
            return self.literal(node, dst, typmod)
        self.supported(node)
        try:
            fn = (casts.explicit(src, dst, typmod) if explicit else casts.implicit(src, dst))
        except casts.CastRefused as exc:
            detail = f" ({_MUTABLE_DETAIL})" if exc.mutable else ""
            raise self.err(node.pos, f"{exc}{detail}") from None
        except LookupError:
            what = "cannot cast" if explicit else "cannot coerce"
            raise self.err(node.pos, f"{what} type {src.display} to {dst.display}") from None
        if fn is None:
            return dataclasses.replace(node, type=dst) if src is not dst else node
        return T.Call(dst, node.pos, f"cast to {dst.display}", fn, (node,))

    def literal(self, node: T.Lit, dst: PgType, typmod: int = -1) -> T.TNode:
        if node.value is None:
            return T.Lit(dst, node.pos, None)
        if dst.category == "X":
            raise self.err(node.pos, f"type {dst.display} is not supported by pgrouter")
        try:
            if dst.category == "A":
                value = parse_array(dst.elem, node.value)
            else:
                value = parse_text(dst, node.value)
                fn = casts.explicit(dst, dst, typmod)
                if fn is not None:
                    value = fn(value)
        except NotImplementedError as exc:
            raise self.err(node.pos, f"{exc} are not supported by pgrouter") from None
        except (ValueError, OverflowError, ArithmeticError) as exc:
            if isinstance(exc, OverflowError) and str(exc):
                raise self.err(node.pos, str(exc)) from None
            raise self.err(node.pos, f"invalid input syntax for type {dst.display}: "
                                     f"\"{node.value}\"") from None
        return T.Lit(dst, node.pos, value)

    def supported(self, node: T.TNode) -> None:
        if node.type.category == "X":
            raise self.err(node.pos, f"values of type {node.type.display} can only be tested "
                                     "with IS [NOT] NULL in pgrouter")

    def common(self, nodes: list[T.TNode], pos: int, what: str = "=", *,
               union: bool = False) -> PgType:
        """The type PostgreSQL compares (operator resolution) or, with ``union``, combines
        (``select_common_type``: CASE, COALESCE, GREATEST/LEAST, IN lists) ``nodes`` in."""
        typ = UNKNOWN
        for node in nodes:
            self.supported(node)
            typ = self.pair(typ, node.type, pos, what, union)
        return TEXT if typ is UNKNOWN else typ

    def pair(self, a: PgType, b: PgType, pos: int, what: str, union: bool = False) -> PgType:
        if a is UNKNOWN:
            return b
        if b is UNKNOWN or a is b:
            return a
        ca, cb = a.category, b.category
        if ca == cb == "N":
            if FLOAT8 in (a, b):
                return FLOAT8
            if FLOAT4 in (a, b):
                # float4 with numeric/int: operators pick the float48 variants, while
                # select_common_type stays on float4 (numeric -> float4 is implicit)
                return FLOAT4 if union else FLOAT8
            if NUMERIC in (a, b):
                return NUMERIC
            return a if INTS.index(a) > INTS.index(b) else b
        if ca == cb == "S":
            if union:  # the first type wins: every string type coerces implicitly to every other
                return BPCHAR if a is BPCHAR else TEXT
            # bpchar = varchar resolves to bpchareq (one exact match); bpchar = text to texteq
            if BPCHAR in (a, b) and TEXT not in (a, b):
                return BPCHAR if {a, b} <= {BPCHAR, VARCHAR} else TEXT
            return TEXT
        if {a, b} == {DATE, TIMESTAMP}:
            return TIMESTAMP
        if {a, b} <= {DATE, TIMESTAMP, TIMESTAMPTZ}:
            raise self.err(pos, f"comparing {a.display} with {b.display} depends on the time "
                                f"zone (not immutable); {_MUTABLE_DETAIL}")
        if ca == "A" and cb == "A":
            return array_of(self.pair(a.elem, b.elem, pos, what))
        raise self.err(pos, f"operator does not exist: {a.display} {what} {b.display}")

    # --- dispatch ------------------------------------------------------------------------

    def bind(self, node: N.Node) -> T.TNode:
        return getattr(self, "bind_" + type(node).__name__)(node)

    def bind_Column(self, node: N.Column) -> T.TNode:
        found = self.columns.get(node.name)
        if found is None:
            if node.name in SYSTEM_COLUMNS:
                raise self.err(node.pos, f"system column \"{node.name}\" is not allowed in a "
                                         "publication row filter")
            if node.name in _SQL_VALUE_FUNCTIONS:
                raise self.err(node.pos, f"{node.name.upper()} is not immutable; "
                                         f"{_MUTABLE_DETAIL}")
            raise self.err(node.pos, f"column \"{node.name}\" does not exist")
        index, col = found
        from .types import BY_OID
        typ = BY_OID.get(col.type_oid)
        if typ is None:
            raise self.err(node.pos, f"column \"{node.name}\" has type oid {col.type_oid}, "
                                     "which pgrouter does not support")
        return T.Col(typ, node.pos, index, node.name)

    def bind_Const(self, node: N.Const) -> T.TNode:
        if node.kind == "int":
            v = int(node.value)
            if INT_RANGE[INT4][0] <= v <= INT_RANGE[INT4][1]:
                return T.Lit(INT4, node.pos, v)
            if INT_RANGE[INT8][0] <= v <= INT_RANGE[INT8][1]:
                return T.Lit(INT8, node.pos, v)
            return T.Lit(NUMERIC, node.pos, Decimal(v))
        if node.kind == "numeric":
            from .types import parse_numeric
            return T.Lit(NUMERIC, node.pos, parse_numeric(node.value))
        if node.kind == "bool":
            return T.Lit(BOOL, node.pos, node.value)
        if node.kind == "trim":
            raise self.err(node.pos, "syntax error")
        return T.Lit(UNKNOWN, node.pos, node.value)  # string or NULL: typed by context

    def bind_TypeCast(self, node: N.TypeCast) -> T.TNode:
        tn = node.type
        try:
            typ, typmod = resolve_type_name(tn.name, tn.mods)
        except NotImplementedError:
            raise self.err(tn.pos, f"type {tn.name} is not supported by pgrouter") from None
        except KeyError:
            raise self.err(tn.pos, f"type \"{tn.name}\" does not exist (user-defined types are "
                                   "not allowed in a publication row filter)") from None
        if tn.array:
            typ = array_of(typ)
        if isinstance(node.arg, N.ArrayExpr) and tn.array:
            items = tuple(self.coerce(self.bind(i), typ.elem, typmod, explicit=True)
                          for i in node.arg.items)
            return T.Array(typ, node.arg.pos, items)
        arg = self.bind(node.arg)
        if arg.type.category == "A" or typ.category == "A":
            if arg.type is UNKNOWN:
                return self.literal(arg, typ)
            if arg.type.category == "A" and typ.category == "A" and isinstance(arg, T.Array):
                items = tuple(self.coerce(i, typ.elem, explicit=True) for i in arg.items)
                return T.Array(typ, arg.pos, items)
            raise self.err(node.pos, "array casts are not supported by pgrouter")
        if arg.type is UNKNOWN and isinstance(arg, T.Lit):
            return self.literal(arg, typ, typmod)
        return self.coerce(arg, typ, typmod, explicit=True)

    def bind_Collate(self, node: N.Collate) -> T.TNode:
        arg = self.bind(node.arg)
        if arg.type is UNKNOWN:
            arg = self.coerce(arg, TEXT)
        if arg.type not in STRINGS:
            raise self.err(node.pos, f"collations are not supported by type {arg.type.display}")
        if node.collation.lower() not in ("c", "posix", "default", "ucs_basic"):
            raise self.err(node.pos, f"collation \"{node.collation}\" is not supported by "
                                     "pgrouter (it compares text with the \"C\" collation)")
        return arg
