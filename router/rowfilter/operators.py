"""The row-filter checker's operators, predicates and function calls, each resolved the way
PostgreSQL resolves it for the supported types or refused with a ``FilterError`` at its
line/column. ``_Operators`` is a part of ``check._Binder``: it relies on the binder's
``bind``, ``coerce``, ``common`` and ``err`` (coercion rules live in ``check``).

Rules: comparison and LIKE operators compare in a common type of both sides; arithmetic
follows ``arith``; IS, IS DISTINCT FROM, BETWEEN, IN, ``op ANY|ALL (array)``, ARRAY[...] and
CASE are typed as PostgreSQL types them; only immutable built-in functions (``functions``)
are allowed.
"""

from __future__ import annotations

from . import arith, casts, functions, typed as T
from . import nodes as N
from .types import (BOOL, BPCHAR, DATE, FLOAT4, FLOAT8, INT4, INTS, NUMERIC, STRINGS, TEXT,
                    UNKNOWN, PgType, array_of)

CMP_OPS = {"=", "<>", "<", "<=", ">", ">="}
LIKE_OPS = {"~~": (False, False), "~~*": (True, False), "!~~": (False, True),
            "!~~*": (True, True)}
_MUTABLE_DETAIL = ("PostgreSQL does not allow user-defined or built-in mutable functions in a "
                   "publication row filter")


class _Operators:
    """Binds operators, predicates and calls; mixed into ``check._Binder``."""

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
