"""Turn a checked filter into nested closures, folding constants the way PostgreSQL's planner
does (``eval_const_expressions``) so that errors and NULL handling agree with it:

* a strict call with a constant NULL argument is NULL, whatever its other arguments;
* a call whose arguments are all constants is evaluated once, here. If that fails (``1/0``)
  PostgreSQL fails on every row; we refuse the filter at compile time instead;
* AND/OR stop folding at the first constant FALSE/TRUE, CASE drops WHEN branches whose
  condition is a constant FALSE/NULL and stops at a constant TRUE, COALESCE stops at the first
  constant non-NULL — the parts not reached are never folded, as in PostgreSQL.

At run time strict calls evaluate every argument before looking for NULLs, AND/OR
short-circuit left to right, CASE and COALESCE evaluate only what they reach — the executor's
order, so a row that errors in PostgreSQL errors here.
"""

from __future__ import annotations

from . import lexer, typed as T
from .errors import FilterEvaluationError

_CONST = object()  # marker: compiled form is (True, value) for constants, (False, fn) otherwise


def compile_tree(node: T.TNode, text: str):
    """Closure taking the converted row (a list) and returning True/False/None."""
    is_const, val = _Compiler(text).comp(node)
    if is_const:
        return lambda v, _c=val: _c
    return val


class _Compiler:
    def __init__(self, text: str):
        self.text = text

    def comp(self, node: T.TNode):
        return getattr(self, "c_" + type(node).__name__)(node)

    def fold(self, node: T.TNode, thunk):
        try:
            return True, thunk()
        except FilterEvaluationError as exc:
            raise lexer.error(self.text, node.pos,
                              f"{exc} (in a constant subexpression, so it fails for every row)"
                              ) from exc

    def c_Col(self, node: T.Col):
        i = node.index
        return False, lambda v: v[i]

    def c_Lit(self, node: T.Lit):
        return True, node.value

    def c_Array(self, node: T.Array):
        parts = [self.comp(i) for i in node.items]
        if all(c for c, _ in parts):
            return True, tuple(x for _, x in parts)
        fns = [(lambda v, _x=x: _x) if c else x for c, x in parts]
        return False, lambda v: tuple([f(v) for f in fns])

    def c_Call(self, node: T.Call):
        fn = node.fn
        parts = [self.comp(a) for a in node.args]
        if any(c and x is None for c, x in parts):
            return True, None
        if all(c for c, _ in parts):
            return self.fold(node, lambda: fn(*[x for _, x in parts]))
        if len(parts) == 1:
            a = parts[0][1]

            def call1(v):
                x = a(v)
                return None if x is None else fn(x)
            return False, call1
        if len(parts) == 2:
            (ca, a), (cb, b) = parts
            if cb:
                def call_rc(v):
                    x = a(v)
                    return None if x is None else fn(x, b)
                return False, call_rc
            if ca:
                def call_lc(v):
                    y = b(v)
                    return None if y is None else fn(a, y)
                return False, call_lc

            def call2(v):
                x = a(v)
                y = b(v)
                return None if x is None or y is None else fn(x, y)
            return False, call2
        fns = [(lambda v, _x=x: _x) if c else x for c, x in parts]

        def calln(v):
            xs = [f(v) for f in fns]
            return None if None in xs else fn(*xs)
        return False, calln

    def c_BoolOp(self, node: T.BoolOp):
        stop = node.op == "or"  # the value that decides: TRUE for OR, FALSE for AND
        fns, has_null = [], False
        for arg in node.args:
            c, x = self.comp(arg)
            if c:
                if x is None:
                    has_null = True
                elif x is stop:
                    return True, stop
                continue
            fns.append(x)
        if not fns:
            return True, None if has_null else (not stop)
        if len(fns) == 1 and not has_null:
            return False, fns[0]
        done = not stop
        if len(fns) == 2 and not has_null:
            f, g = fns

            def two(v):
                r = f(v)
                if r is stop:
                    return stop
                s = g(v)
                if s is stop:
                    return stop
                return None if r is None or s is None else done
            return False, two

        def many(v):
            null = has_null
            for f in fns:
                r = f(v)
                if r is stop:
                    return stop
                if r is None:
                    null = True
            return None if null else done
        return False, many

    def c_Not(self, node: T.Not):
        c, a = self.comp(node.arg)
        if c:
            return True, None if a is None else not a
        return False, lambda v: None if (r := a(v)) is None else not r

    def c_NullTest(self, node: T.NullTest):
        return self._is(node.arg, None, node.negated)

    def c_BoolTest(self, node: T.BoolTest):
        target = {"true": True, "false": False, "unknown": None}[node.what]
        return self._is(node.arg, target, node.negated)

    def _is(self, arg, target, neg: bool):
        """``arg IS [NOT] target`` (NULL, TRUE, FALSE, UNKNOWN: never NULL itself)."""
        c, a = self.comp(arg)
        if c:
            return True, (a is target) != neg
        if neg:
            return False, lambda v: a(v) is not target
        return False, lambda v: a(v) is target

    def c_IsDistinct(self, node: T.IsDistinct):
        (ca, a), (cb, b) = self.comp(node.left), self.comp(node.right)
        eq, neg = node.eq, node.negated

        def distinct(x, y):
            if x is None or y is None:
                return (x is None) != (y is None)
            return not eq(x, y)
        if ca and cb:
            return True, distinct(a, b) != neg
        fa = (lambda v: a) if ca else a
        fb = (lambda v: b) if cb else b
        return False, lambda v: distinct(fa(v), fb(v)) != neg

    def c_CaseWhen(self, node: T.CaseWhen):
        branches = []
        default = None
        for cond, result in node.whens:
            c, x = self.comp(cond)
            if c and x is not True:
                continue  # constant FALSE/NULL: never taken, result never folded
            r = self.comp(result)
            if c:
                default = r
                break
            branches.append((x, r))
        if default is None:
            default = self.comp(node.default)
        if not branches:
            return default
        fns = [(cond, (lambda v, _x=x: _x) if rc else x) for cond, (rc, x) in branches]
        dc, dx = default
        dfn = (lambda v: dx) if dc else dx

        def case(v):
            for cond, res in fns:
                if cond(v) is True:
                    return res(v)
            return dfn(v)
        return False, case

    def c_Coalesce(self, node: T.Coalesce):
        fns = []
        for arg in node.args:
            c, x = self.comp(arg)
            if c:
                if x is None:
                    continue
                if not fns:
                    return True, x
                fns.append(lambda v, _x=x: _x)
                break
            fns.append(x)
        if not fns:
            return True, None

        def coalesce(v):
            for f in fns:
                r = f(v)
                if r is not None:
                    return r
            return None
        return False, coalesce

    def c_MinMax(self, node: T.MinMax):
        parts = [self.comp(a) for a in node.args]
        key, pick = node.key, (max if node.greatest else min)

        def choose(xs):
            xs = [x for x in xs if x is not None]
            return pick(xs, key=key) if xs else None
        if all(c for c, _ in parts):
            return True, choose([x for _, x in parts])
        fns = [(lambda v, _x=x: _x) if c else x for c, x in parts]
        return False, lambda v: choose([f(v) for f in fns])

    def c_NullIf(self, node: T.NullIf):
        (ca, a), (cb, b) = self.comp(node.left), self.comp(node.right)
        eq = node.eq

        def nullif(x, y):
            if x is None or y is None:
                return x
            return None if eq(x, y) else x
        if ca and cb:
            return self.fold(node, lambda: nullif(a, b))
        fa = (lambda v: a) if ca else a
        fb = (lambda v: b) if cb else b
        return False, lambda v: nullif(fa(v), fb(v))

    def c_ArrayOp(self, node: T.ArrayOp):
        (cl, left), (ca, arr) = self.comp(node.left), self.comp(node.array)
        cmp, use_all = node.cmp, node.all

        def scan(x, items):
            if items is None:
                return None
            if not items:
                return use_all
            if x is None:
                return None
            null = False
            for y in items:
                if y is None:
                    null = True
                    continue
                r = cmp(x, y)
                if r is not use_all:  # ANY: found a TRUE; ALL: found a FALSE
                    return r
            return None if null else use_all
        if cl and ca:
            return self.fold(node, lambda: scan(left, arr))
        fl = (lambda v: left) if cl else left
        if ca:
            return False, lambda v: scan(fl(v), arr)
        return False, lambda v: scan(fl(v), arr(v))
