"""Recursive-descent (Pratt) parser for publication row-filter expressions.

Precedence, lowest first, as in PostgreSQL's ``gram.y``: OR, AND, NOT, IS/ISNULL/NOTNULL,
comparison (``< > = <= >= <>``), BETWEEN/IN/LIKE/ILIKE/SIMILAR, any other operator (``||``,
``~~``…), ``+ -``, ``* / %``, ``^``, AT, COLLATE, unary minus, ``[ ]``, ``::``.

It accepts what people write and what ``pg_get_expr(prqual, prrelid)`` prints (``~~`` for LIKE,
``= ANY (ARRAY[...])``, ``'...'::type`` casts, ``SUBSTRING(x FROM a FOR b)``, ``TRIM(BOTH
FROM x)``, ``POSITION((a) IN (b))``). Constructs PostgreSQL refuses in a publication filter for
syntactic reasons (subqueries, window functions, parameters) are rejected here with their
position; everything else about validity is ``check.py``'s job.
"""

from __future__ import annotations

from . import lexer as L
from .nodes import (AnyAll, ArrayExpr, Between, Binary, Case, Collate, Column, Const, Distinct,
                    FuncCall, InList, IsTest, Node, TypeCast, TypeName, Unary)

_CMP_OPS = {"<", ">", "=", "<=", ">=", "<>"}
_OR, _AND, _NOT, _IS, _CMP, _LIKE, _OP, _ADD, _MUL, _POW, _AT, _COLLATE, _UMINUS, _SUB, _CAST = (
    10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150)

# words that cannot be a column name without quotes (a subset of PostgreSQL's reserved list)
_RESERVED = {"and", "or", "not", "is", "null", "true", "false", "in", "between", "like", "ilike",
             "similar", "case", "when", "then", "else", "end", "cast", "array", "any", "all",
             "some", "distinct", "from", "collate", "escape", "select", "exists", "isnull",
             "notnull", "with", "values", "as", "for", "symmetric", "asymmetric", "over"}

# type names that may prefix a string literal (``date '2024-01-01'``)
_TYPE_WORDS = {"int", "integer", "int2", "int4", "int8", "smallint", "bigint", "real", "float",
               "float4", "float8", "double", "numeric", "decimal", "dec", "text", "varchar",
               "char", "character", "bpchar", "boolean", "bool", "date", "time", "timestamp",
               "timestamptz", "interval", "uuid", "bytea", "json", "jsonb", "name", "oid"}


def parse(text: str) -> Node:
    return _Parser(text).parse_all()


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = L.tokenize(text)
        self.i = 0

    # --- token helpers -------------------------------------------------------------------

    def peek(self, k: int = 0) -> L.Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def next(self) -> L.Token:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def is_word(self, word: str, k: int = 0) -> bool:
        tok = self.peek(k)
        return tok.kind == L.IDENT and tok.value == word

    def is_punct(self, ch: str, k: int = 0) -> bool:
        tok = self.peek(k)
        return tok.kind == L.PUNCT and tok.value == ch

    def accept_word(self, word: str) -> bool:
        if self.is_word(word):
            self.i += 1
            return True
        return False

    def expect_word(self, word: str) -> L.Token:
        if not self.is_word(word):
            raise self.syntax_error()
        return self.next()

    def expect_punct(self, ch: str) -> L.Token:
        if not self.is_punct(ch):
            raise self.syntax_error()
        return self.next()

    def syntax_error(self, tok: L.Token | None = None):
        tok = tok or self.peek()
        if tok.kind == L.EOF:
            return L.error(self.text, tok.offset, "syntax error at end of input")
        shown = self.text[tok.offset:tok.offset + max(len(tok.value), 1)]
        return L.error(self.text, tok.offset, f"syntax error at or near {shown!r}")

    def fail(self, offset: int, message: str):
        return L.error(self.text, offset, message)

    # --- grammar -------------------------------------------------------------------------

    def parse_all(self) -> Node:
        if self.peek().kind == L.EOF:
            raise self.fail(0, "empty row filter")
        node = self.expr(0)
        if self.peek().kind != L.EOF:
            raise self.syntax_error()
        return node

    def expr(self, rbp: int) -> Node:
        left = self.prefix()
        while True:
            tok = self.peek()
            lbp, handler = self.infix_of(tok)
            if handler is None or lbp <= rbp:
                return left
            left = handler(left)

    def infix_of(self, tok: L.Token):
        if tok.kind == L.OP:
            v = tok.value
            if v == "::":
                return _CAST, self.parse_cast
            if v in _CMP_OPS:
                return _CMP, self.parse_operator
            if v in ("+", "-"):
                return _ADD, self.parse_operator
            if v in ("*", "/", "%"):
                return _MUL, self.parse_operator
            if v == "^":
                return _POW, self.parse_operator
            return _OP, self.parse_operator
        if tok.kind == L.PUNCT and tok.value == "[":
            return _SUB, self.reject_subscript
        if tok.kind != L.IDENT:
            return 0, None
        v = tok.value
        if v == "or":
            return _OR, self.parse_bool
        if v == "and":
            return _AND, self.parse_bool
        if v in ("is", "isnull", "notnull"):
            return _IS, self.parse_is
        if v in ("between", "in", "like", "ilike", "similar"):
            return _LIKE, self.parse_predicate
        if v == "not" and self.peek(1).kind == L.IDENT and self.peek(1).value in (
                "between", "in", "like", "ilike", "similar"):
            return _LIKE, self.parse_predicate
        if v == "collate":
            return _COLLATE, self.parse_collate
        if v == "at":
            return _AT, self.reject_at
        return 0, None

    def parse_cast(self, left: Node) -> Node:
        tok = self.next()
        return TypeCast(tok.offset, left, self.type_name())

    def parse_operator(self, left: Node) -> Node:
        tok = self.next()
        op = tok.value
        lbp = self.infix_of(tok)[0]
        if (self.peek().kind == L.IDENT and self.peek().value in ("any", "some", "all")
                and self.is_punct("(", 1)):
            quant = self.next().value
            self.expect_punct("(")
            self.reject_subquery()
            right = self.expr(0)
            self.expect_punct(")")
            return AnyAll(tok.offset, op, left, right, quant == "all")
        right = self.expr(lbp)
        return Binary(tok.offset, op, left, right)

    def parse_bool(self, left: Node) -> Node:
        tok = self.next()
        bp = _OR if tok.value == "or" else _AND
        return Binary(tok.offset, tok.value, left, self.expr(bp))

    def parse_is(self, left: Node) -> Node:
        tok = self.next()
        if tok.value == "isnull":
            return IsTest(tok.offset, left, "null", False)
        if tok.value == "notnull":
            return IsTest(tok.offset, left, "null", True)
        negated = self.accept_word("not")
        word = self.peek()
        if word.kind == L.IDENT and word.value in ("null", "true", "false", "unknown"):
            self.next()
            return IsTest(tok.offset, left, word.value, negated)
        if self.accept_word("distinct"):
            self.expect_word("from")
            return Distinct(tok.offset, left, self.expr(_IS), negated)
        if word.kind == L.IDENT and word.value in ("document", "normalized", "json", "of"):
            raise self.fail(word.offset, f"IS {word.value.upper()} is not supported by pgrouter")
        raise self.syntax_error()

    def parse_predicate(self, left: Node) -> Node:
        start = self.peek()
        negated = self.accept_word("not")
        tok = self.next()
        kind = tok.value
        if kind == "between":
            symmetric = self.accept_word("symmetric")
            if not symmetric:
                self.accept_word("asymmetric")
            low = self.expr(_LIKE)
            self.expect_word("and")
            high = self.expr(_LIKE)
            return Between(start.offset, left, low, high, negated, symmetric)
        if kind == "in":
            self.expect_punct("(")
            self.reject_subquery()
            items = [self.expr(0)]
            while self.is_punct(","):
                self.next()
                items.append(self.expr(0))
            self.expect_punct(")")
            return InList(start.offset, left, tuple(items), negated)
        if kind == "similar":
            raise self.fail(tok.offset, "SIMILAR TO is not supported by pgrouter")
        pattern = self.expr(_LIKE)
        if self.is_word("escape"):
            raise self.fail(self.peek().offset, "LIKE ... ESCAPE is not supported by pgrouter "
                            "(the default escape character is backslash)")
        op = "~~" if kind == "like" else "~~*"
        return Binary(tok.offset, ("!" + op) if negated else op, left, pattern)

    def parse_collate(self, left: Node) -> Node:
        tok = self.next()
        name = self.next()
        if name.kind not in (L.IDENT, L.QIDENT):
            raise self.syntax_error(name)
        collation = name.value
        if self.is_punct("."):
            self.next()
            collation = self.next().value
        return Collate(tok.offset, left, collation)

    def reject_subscript(self, left: Node) -> Node:
        raise self.fail(self.peek().offset, "array subscripts are not supported by pgrouter")

    def reject_at(self, left: Node) -> Node:
        raise self.fail(self.peek().offset, "AT TIME ZONE is not supported by pgrouter")

    def reject_subquery(self) -> None:
        tok = self.peek()
        if tok.kind == L.IDENT and tok.value in ("select", "with", "values", "table"):
            raise self.fail(tok.offset, "subqueries are not allowed in a publication row filter")

    # --- prefix forms --------------------------------------------------------------------

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
