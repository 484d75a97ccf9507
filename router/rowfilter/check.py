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

from . import arith, casts, functions, lexer, typed as T
from . import nodes as N
from .types import (VARCHAR, BOOL, BPCHAR, DATE, FLOAT4, FLOAT8, INTS, INT4, INT8, NUMERIC, STRINGS,
                    TEXT, TIMESTAMP, TIMESTAMPTZ, UNKNOWN, PgType, array_of, parse_array,
                    parse_text, resolve_type_name, INT_RANGE)

CMP_OPS = {"=", "<>", "<", "<=", ">", ">="}
LIKE_OPS = {"~~": (False, False), "~~*": (True, False), "!~~": (False, True),
            "!~~*": (True, True)}
SYSTEM_COLUMNS = {"ctid", "xmin", "xmax", "cmin", "cmax", "tableoid", "oid"}
_SQL_VALUE_FUNCTIONS = {"current_timestamp", "current_date", "current_time", "localtime",
                        "localtimestamp", "current_user", "session_user", "user", "current_role",
                        "current_catalog", "current_schema"}
_MUTABLE_DETAIL = ("PostgreSQL does not allow user-defined or built-in mutable functions in a "
                   "publication row filter")


def check(tree: N.Node, text: str, columns: Sequence) -> T.TNode:
    node = _Binder(text, columns).top(tree)
    return node


class _Binder:
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

    def bind_Unary(self, node: N.Unary) -> T.TNode:
        arg = self.bind(node.arg)
        if node.op == "not":
            return T.Not(BOOL, node.pos, self.as_bool(arg, "NOT"))
        self.supported(arg)
        if arg.type.category != "N":
            raise self.err(node.pos, f"operator does not exist: {node.op} {arg.type.display}")
        if node.op == "+":
            return arg
        return T.Call(arg.type, node.pos, "-", self.num_ops(arg.type)["neg"], (arg,))

    def num_ops(self, typ: PgType) -> dict:
        if typ in INTS:
            return arith.int_ops(typ)
        if typ is NUMERIC:
            return arith.NUMERIC_OPS
        return arith.float_ops(typ)

    def bind_Binary(self, node: N.Binary) -> T.TNode:
        if node.op in ("and", "or"):
            args = []
            for side in (node.left, node.right):
                b = self.as_bool(self.bind(side), node.op.upper())
                args.extend(b.args if isinstance(b, T.BoolOp) and b.op == node.op else [b])
            return T.BoolOp(BOOL, node.pos, node.op, tuple(args))
        left, right = self.bind(node.left), self.bind(node.right)
        return self.operator(node.op, left, right, node.pos)

    def operator(self, op: str, left: T.TNode, right: T.TNode, pos: int) -> T.TNode:
        if op in CMP_OPS:
            typ = self.common([left, right], pos, op)
            left, right = self.coerce(left, typ), self.coerce(right, typ)
            return T.Call(BOOL, pos, op, arith.comparator(typ, op), (left, right))
        if op in LIKE_OPS:
            fold, negated = LIKE_OPS[op]
            ltype = BPCHAR if left.type is BPCHAR else TEXT
            left, right = self.coerce(left, ltype), self.coerce(right, TEXT)
            fn = arith.ilike if fold else arith.like
            if negated:
                base = fn
                fn = lambda s, p: not base(s, p)  # noqa: E731
            return T.Call(BOOL, pos, op, fn, (left, right))
        if op == "||":
            for side in (left, right):
                if side.type not in STRINGS and side.type is not UNKNOWN:
                    raise self.err(side.pos, f"operator || with an operand of type "
                                             f"{side.type.display} is not immutable; "
                                             f"{_MUTABLE_DETAIL}")
            left, right = self.coerce(left, TEXT), self.coerce(right, TEXT)
            return T.Call(TEXT, pos, op, lambda a, b: a + b, (left, right))
        if op in ("+", "-", "*", "/", "%"):
            return self.arithmetic(op, left, right, pos)
        if op in ("~", "~*", "!~", "!~*"):
            raise self.err(pos, f"regular expression operator {op} is not supported by pgrouter")
        raise self.err(pos, f"operator {op} is not supported by pgrouter")

    def arithmetic(self, op: str, left: T.TNode, right: T.TNode, pos: int) -> T.TNode:
        lt, rt = left.type, right.type
        if DATE in (lt, rt) and op in ("+", "-"):
            return self.date_arith(op, left, right, pos)
        if lt is UNKNOWN and rt is UNKNOWN:
            raise self.err(pos, f"operator is not unique: unknown {op} unknown")
        typ = self.common([left, right], pos, op)
        if typ.category != "N":
            raise self.err(pos, f"operator does not exist: {lt.display} {op} {rt.display}")
        if op == "%" and typ in (FLOAT4, FLOAT8):
            raise self.err(pos, f"operator does not exist: {typ.display} % {typ.display}")
        if typ is FLOAT8 and lt is FLOAT4 and rt in (FLOAT4, UNKNOWN) or (
                typ is FLOAT8 and rt is FLOAT4 and lt is UNKNOWN):
            typ = FLOAT4
        if typ is FLOAT8 and lt is rt is FLOAT4:
            typ = FLOAT4
        left, right = self.coerce(left, typ), self.coerce(right, typ)
        return T.Call(typ, pos, op, self.num_ops(typ)[op], (left, right))

    def date_arith(self, op, left, right, pos) -> T.TNode:
        from .temporal import INF

        def shift(sign):
            def f(d, n):
                return d if d in (INF, -INF) else d + sign * n
            return f
        if left.type is DATE and right.type is DATE and op == "-":
            def diff(a, b):
                if a in (INF, -INF) or b in (INF, -INF):
                    from .errors import FilterEvaluationError
                    raise FilterEvaluationError("cannot subtract infinite dates", sqlstate="22008")
                return a - b
            return T.Call(INT4, pos, op, diff, (left, right))
        if left.type is DATE and (right.type in INTS[:2] or right.type is UNKNOWN):
            return T.Call(DATE, pos, op, shift(1 if op == "+" else -1),
                          (left, self.coerce(right, INT4)))
        if right.type is DATE and op == "+" and left.type in INTS[:2]:
            return T.Call(DATE, pos, op, lambda n, d: shift(1)(d, n),
                          (self.coerce(left, INT4), right))
        raise self.err(pos, f"operator {left.type.display} {op} {right.type.display} is not "
                            "supported by pgrouter")

    def bind_IsTest(self, node: N.IsTest) -> T.TNode:
        arg = self.bind(node.arg)
        if node.what == "null":
            if arg.type is UNKNOWN:
                arg = self.coerce(arg, TEXT)
            return T.NullTest(BOOL, node.pos, arg, node.negated)
        return T.BoolTest(BOOL, node.pos, self.as_bool(arg, f"IS {node.what.upper()}"),
                          node.what, node.negated)

    def bind_Distinct(self, node: N.Distinct) -> T.TNode:
        left, right = self.bind(node.left), self.bind(node.right)
        typ = self.common([left, right], node.pos)
        return T.IsDistinct(BOOL, node.pos, self.coerce(left, typ), self.coerce(right, typ),
                            arith.comparator(typ, "="), node.negated)

    def bind_Between(self, node: N.Between) -> T.TNode:
        arg, lo, hi = self.bind(node.arg), self.bind(node.low), self.bind(node.high)
        p = node.pos

        def rng(a, b):
            if node.negated:
                return T.BoolOp(BOOL, p, "or", (self.operator("<", arg, a, p),
                                                 self.operator(">", arg, b, p)))
            return T.BoolOp(BOOL, p, "and", (self.operator(">=", arg, a, p),
                                              self.operator("<=", arg, b, p)))
        if not node.symmetric:
            return rng(lo, hi)
        return T.BoolOp(BOOL, p, "and" if node.negated else "or", (rng(lo, hi), rng(hi, lo)))

    def bind_InList(self, node: N.InList) -> T.TNode:
        """As PostgreSQL's transformAExprIn: two or more items without column references
        become ``arg = ANY (ARRAY[...])`` in their common type; the others (or all, if fewer
        than two qualify) are separate comparisons OR-ed (AND-ed for NOT IN) in order."""
        arg = self.bind(node.arg)
        op, join = ("<>", "and") if node.negated else ("=", "or")
        bound = [(self.bind(i), _has_column(i)) for i in node.items]
        nonvars = [b for b, has in bound if not has]
        rest = [b for b, _ in bound]
        result = None
        if len(nonvars) > 1:
            typ = self.common([arg, *nonvars], node.pos, union=True)
            array = T.Array(array_of(typ), node.pos, tuple(self.coerce(i, typ) for i in nonvars))
            result = T.ArrayOp(BOOL, node.pos, self.coerce(arg, typ), array,
                               arith.comparator(typ, op), node.negated)
            rest = [b for b, has in bound if has]
        for item in rest:
            cmp = self.operator(op, arg, item, node.pos)
            result = cmp if result is None else T.BoolOp(BOOL, node.pos, join, (result, cmp))
        return result

    def bind_ArrayExpr(self, node: N.ArrayExpr) -> T.TNode:
        items = [self.bind(i) for i in node.items]
        if not items:
            raise self.err(node.pos, "cannot determine type of empty array")
        typ = self.common(items, node.pos, union=True)
        return T.Array(array_of(typ), node.pos, tuple(self.coerce(i, typ) for i in items))

    def bind_AnyAll(self, node: N.AnyAll) -> T.TNode:
        left, right = self.bind(node.left), self.bind(node.right)
        if right.type is UNKNOWN:
            if left.type is UNKNOWN:
                left = self.coerce(left, TEXT)
            right = self.coerce(right, array_of(TEXT if left.type in STRINGS else left.type))
        if right.type.category != "A":
            raise self.err(node.pos, f"op ANY/ALL (array) requires array on right side")
        elem = right.type.elem
        if node.op in LIKE_OPS:
            probe = self.operator(node.op, left, T.Lit(TEXT, node.pos, ""), node.pos)
            left = probe.args[0]
            right = self.coerce_array(right, TEXT, node.pos)
            cmp = probe.fn
        elif node.op in CMP_OPS:
            typ = self.common([left, T.Lit(elem, right.pos, None)], node.pos, node.op)
            left, right = self.coerce(left, typ), self.coerce_array(right, typ, node.pos)
            cmp = arith.comparator(typ, node.op)
        else:
            raise self.err(node.pos, f"operator {node.op} ANY/ALL is not supported by pgrouter")
        return T.ArrayOp(BOOL, node.pos, left, right, cmp, node.all)

    def coerce_array(self, array: T.TNode, typ: PgType, pos: int) -> T.TNode:
        if array.type.elem is typ:
            return array
        if isinstance(array, T.Array):
            return T.Array(array_of(typ), array.pos, tuple(self.coerce(i, typ) for i in array.items))
        if isinstance(array, T.Lit):
            fn = casts.implicit(array.type.elem, typ)
            vals = array.value if array.value is None or fn is None else tuple(
                None if v is None else fn(v) for v in array.value)
            return T.Lit(array_of(typ), array.pos, vals)
        raise self.err(pos, "array element conversion is not supported by pgrouter")

    def bind_Case(self, node: N.Case) -> T.TNode:
        arg = self.bind(node.arg) if node.arg is not None else None
        conds, results = [], []
        for cond, result in node.whens:
            c = self.bind(cond)
            conds.append(self.operator("=", arg, c, cond.pos) if arg is not None
                         else self.as_bool(c, "CASE/WHEN"))
            results.append(self.bind(result))
        default = self.bind(node.default) if node.default is not None else None
        outs = results + ([default] if default is not None else [])
        typ = self.common(outs, node.pos, "CASE", union=True)
        results = [self.coerce(r, typ) for r in results]
        default = self.coerce(default, typ) if default is not None else T.Lit(typ, node.pos, None)
        return T.CaseWhen(typ, node.pos, tuple(zip(conds, results)), default)

    def bind_FuncCall(self, node: N.FuncCall) -> T.TNode:
        name = node.name
        if node.schema not in (None, "pg_catalog"):
            raise self.err(node.pos, f"function {node.schema}.{name}() is not a built-in; "
                                     "user-defined functions are not allowed in a publication "
                                     "row filter")
        if name in functions.AGGREGATES:
            raise self.err(node.pos, f"aggregate/window function {name}() is not allowed in a "
                                     "publication row filter")
        if name in functions.SET_RETURNING:
            raise self.err(node.pos, f"set-returning function {name}() is not allowed in a "
                                     "publication row filter")
        if name in functions.NOT_IMMUTABLE:
            raise self.err(node.pos, f"function {name}() is not immutable "
                                     f"({functions.NOT_IMMUTABLE[name]}); {_MUTABLE_DETAIL}")
        raw = list(node.args)
        if name == "trim" and raw and isinstance(raw[0], N.Const) and raw[0].kind == "trim":
            name = raw.pop(0).value
        args = [self.bind(a) for a in raw]
        if name in ("coalesce", "greatest", "least") and args:
            typ = self.common(args, node.pos, name.upper(), union=True)
            args = tuple(self.coerce(a, typ) for a in args)
            if name == "coalesce":
                return T.Coalesce(typ, node.pos, args)
            return T.MinMax(typ, node.pos, args, name == "greatest", arith.sort_key(typ))
        if name == "nullif" and len(args) == 2:
            typ = self.common(args, node.pos, "=")
            left = self.coerce(args[0], args[0].type if args[0].type is not UNKNOWN else typ)
            conv = casts.implicit(left.type, typ)
            right = self.coerce(args[1], typ)
            cmp = arith.comparator(typ, "=")
            eq = cmp if conv is None else (lambda a, b: cmp(conv(a), b))
            return T.NullIf(left.type, node.pos, left, right, eq)
        for a in args:
            self.supported(a)
        try:
            found = functions.resolve(name, [a.type for a in args])
        except functions.MutableFunction as exc:
            raise self.err(node.pos, f"function {exc.signature} is not immutable "
                                     f"({exc.volatility}); {_MUTABLE_DETAIL}") from None
        shown = f"{name}({', '.join(a.type.display for a in args)})"
        if found is None:
            if name in functions.KNOWN:
                raise self.err(node.pos, f"function {shown} does not exist")
            raise self.err(node.pos, f"function {shown} is not a built-in immutable function "
                                     "pgrouter supports (user-defined functions are not "
                                     "allowed in a publication row filter)")
        params, ret, impl = found
        args = tuple(self.coerce(a, p) for a, p in zip(args, params))
        return T.Call(ret, node.pos, name, impl, args)


def _has_column(node) -> bool:
    if isinstance(node, N.Column):
        return True
    for field in getattr(node, "__slots__", ()):
        value = getattr(node, field)
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if isinstance(item, tuple):
                if any(_has_column(x) for x in item if isinstance(x, N.Node)):
                    return True
            elif isinstance(item, N.Node) and _has_column(item):
                return True
    return False
