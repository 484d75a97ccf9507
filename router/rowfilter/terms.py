"""The row-filter parser's prefix forms: literals, columns, function calls (with SQL's special
argument syntaxes: ``SUBSTRING(x FROM a FOR b)``, ``TRIM(BOTH FROM x)``, ``POSITION(a IN b)``),
CASE, ARRAY[...], typed literals and type names. ``_Terms`` is a part of ``parser._Parser``:
it relies on the parser's token helpers and ``expr``.
"""

from __future__ import annotations

from . import lexer as L
from .grammar import _LIKE, _NOT, _RESERVED, _TYPE_WORDS, _UMINUS
from .nodes import ArrayExpr, Case, Column, Const, FuncCall, Node, TypeCast, TypeName, Unary


class _Terms:
    """Parses prefix forms; mixed into ``parser._Parser``."""

    def prefix(self) -> Node:
        tok = self.next()
        kind, v = tok.kind, tok.value
        if kind == L.INT:
            return Const(tok.offset, "int", v)
        if kind == L.NUMERIC:
            return Const(tok.offset, "numeric", v)
        if kind == L.STRING:
            return Const(tok.offset, "string", v)
        if kind == L.OP and v in ("-", "+"):
            arg = self.expr(_UMINUS)
            if isinstance(arg, Const) and arg.kind in ("int", "numeric"):
                # PostgreSQL folds a sign into a numeric literal (so -2147483648 is an integer)
                if v == "+":
                    return Const(tok.offset, arg.kind, arg.value)
                text = arg.value[1:] if arg.value.startswith("-") else "-" + arg.value
                return Const(tok.offset, arg.kind, text)
            return Unary(tok.offset, v, arg)
        if kind == L.OP:
            raise self.fail(tok.offset, f"prefix operator {v} is not supported by pgrouter")
        if kind == L.PUNCT and v == "(":
            self.reject_subquery()
            inner = self.expr(0)
            if self.is_punct(","):
                raise self.fail(tok.offset, "row constructors are not supported by pgrouter")
            self.expect_punct(")")
            return inner
        if kind == L.QIDENT:
            return self.name_or_call(tok)
        if kind != L.IDENT:
            raise self.syntax_error(tok)
        if v == "not":
            return Unary(tok.offset, "not", self.expr(_NOT))
        if v in ("true", "false"):
            return Const(tok.offset, "bool", v == "true")
        if v == "null":
            return Const(tok.offset, "null", None)
        if v == "case":
            return self.parse_case(tok)
        if v == "cast":
            self.expect_punct("(")
            arg = self.expr(0)
            self.expect_word("as")
            tname = self.type_name()
            self.expect_punct(")")
            return TypeCast(tok.offset, arg, tname)
        if v == "array":
            if self.is_punct("("):
                raise self.fail(tok.offset, "subqueries are not allowed in a publication row filter")
            return self.array_body(tok)
        if v == "exists":
            raise self.fail(tok.offset, "subqueries are not allowed in a publication row filter")
        if v in ("select", "with", "values"):
            raise self.fail(tok.offset, "subqueries are not allowed in a publication row filter")
        if v in _TYPE_WORDS and not self.is_punct("(") and self.peek().kind in (L.IDENT, L.STRING):
            save = self.i
            self.i -= 1
            tname = self.type_name()
            if self.peek().kind == L.STRING:
                lit = self.next()
                return TypeCast(tok.offset, Const(lit.offset, "string", lit.value), tname)
            self.i = save
        if v in _RESERVED:
            raise self.syntax_error(tok)
        return self.name_or_call(tok)

    def array_body(self, tok: L.Token) -> Node:
        self.expect_punct("[")
        items: list[Node] = []
        if not self.is_punct("]"):
            while True:
                if self.is_punct("["):
                    raise self.fail(self.peek().offset,
                                    "multidimensional arrays are not supported by pgrouter")
                items.append(self.expr(0))
                if not self.is_punct(","):
                    break
                self.next()
        self.expect_punct("]")
        return ArrayExpr(tok.offset, tuple(items))

    def parse_case(self, tok: L.Token) -> Node:
        arg = None if self.is_word("when") else self.expr(0)
        whens = []
        while self.accept_word("when"):
            cond = self.expr(0)
            self.expect_word("then")
            whens.append((cond, self.expr(0)))
        if not whens:
            raise self.syntax_error()
        default = self.expr(0) if self.accept_word("else") else None
        self.expect_word("end")
        return Case(tok.offset, arg, tuple(whens), default)

    def name_or_call(self, tok: L.Token) -> Node:
        schema = None
        name = tok.value
        if self.is_punct("."):
            self.next()
            nxt = self.next()
            if nxt.kind not in (L.IDENT, L.QIDENT):
                raise self.syntax_error(nxt)
            if not self.is_punct("("):
                raise self.fail(tok.offset, f"qualified column reference {tok.value}.{nxt.value} "
                                "is not supported by pgrouter; use the bare column name")
            schema, name = tok.value, nxt.value
        if not self.is_punct("("):
            return Column(tok.offset, name)
        self.next()
        args = self.call_args(tok, name)
        self.expect_punct(")")
        for word in ("over", "filter", "within"):
            if self.is_word(word):
                what = "window functions" if word == "over" else "aggregate functions"
                raise self.fail(tok.offset, f"{what} are not allowed in a publication row filter")
        return FuncCall(tok.offset, name, tuple(args), schema)

    def call_args(self, tok: L.Token, name: str) -> list[Node]:
        if self.is_punct(")"):
            return []
        if self.peek().kind == L.OP and self.peek().value == "*":
            raise self.fail(tok.offset, f"aggregate functions are not allowed in a publication "
                            f"row filter ({name}(*))")
        if self.is_word("distinct"):
            raise self.fail(tok.offset, "aggregate functions are not allowed in a publication "
                            "row filter")
        if name == "trim":
            return self.trim_args(tok)
        if name == "position":
            first = self.expr(_LIKE)
            if self.accept_word("in"):
                return [self.expr(_LIKE), first]  # POSITION(a IN b) is position(b, a)
        else:
            first = self.expr(0)
        if name in ("substring", "overlay") and self.is_word("from"):
            self.next()
            args = [first, self.expr(0)]
            if self.accept_word("for"):
                args.append(self.expr(0))
            return args
        if name == "substring" and self.is_word("for"):
            self.next()
            return [first, Const(first.pos, "int", "1"), self.expr(0)]
        if name == "extract" and self.is_word("from"):
            raise self.fail(tok.offset, "EXTRACT is not supported by pgrouter")
        args = [first]
        while self.is_punct(","):
            self.next()
            args.append(self.expr(0))
        return args

    def trim_args(self, tok: L.Token) -> list[Node]:
        mode = "both"
        if self.peek().kind == L.IDENT and self.peek().value in ("both", "leading", "trailing"):
            mode = self.next().value
        fname = {"both": "btrim", "leading": "ltrim", "trailing": "rtrim"}[mode]
        if self.accept_word("from"):
            args = [self.expr(0)]
        else:
            first = self.expr(0)
            if self.accept_word("from"):
                args = [self.expr(0), first]
            else:
                args = [first]
                while self.is_punct(","):
                    self.next()
                    args.append(self.expr(0))
        return [Const(tok.offset, "trim", fname), *args]

    def type_name(self) -> TypeName:
        tok = self.next()
        if tok.kind not in (L.IDENT, L.QIDENT):
            raise self.syntax_error(tok)
        words = [tok.value]
        if self.is_punct(".") and self.peek(1).kind in (L.IDENT, L.QIDENT):
            self.next()
            words = [self.next().value]  # schema-qualified: pg_catalog.int4
        first = words[0]
        if first == "double" and self.accept_word("precision"):
            words.append("precision")
        elif first in ("character", "char", "national") :
            if first == "national":
                words.append(self.expect_word("character").value)
            if self.accept_word("varying"):
                words.append("varying")
        mods: list[int] = []
        if self.is_punct("("):
            self.next()
            while True:
                t = self.next()
                if t.kind != L.INT:
                    raise self.syntax_error(t)
                mods.append(int(t.value))
                if not self.is_punct(","):
                    break
                self.next()
            self.expect_punct(")")
        if first in ("timestamp", "time"):
            if self.is_word("with") or self.is_word("without"):
                words.append(self.next().value)
                self.expect_word("time")
                self.expect_word("zone")
                words += ["time", "zone"]
        array = False
        while self.is_punct("["):
            self.next()
            if self.peek().kind == L.INT:
                self.next()
            self.expect_punct("]")
            array = True
        if self.accept_word("array"):
            array = True
        return TypeName(tok.offset, " ".join(words), tuple(mods), array)
