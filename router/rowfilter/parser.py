"""Recursive-descent (Pratt) parser for publication row-filter expressions.

Precedence, lowest first, as in PostgreSQL's ``gram.y``: OR, AND, NOT, IS/ISNULL/NOTNULL,
comparison (``< > = <= >= <>``), BETWEEN/IN/LIKE/ILIKE/SIMILAR, any other operator (``||``,
``~~``…), ``+ -``, ``* / %``, ``^``, AT, COLLATE, unary minus, ``[ ]``, ``::``.

It accepts what people write and what ``pg_get_expr(prqual, prrelid)`` prints (``~~`` for LIKE,
``= ANY (ARRAY[...])``, ``'...'::type`` casts, ``SUBSTRING(x FROM a FOR b)``, ``TRIM(BOTH
FROM x)``, ``POSITION((a) IN (b))``). Constructs PostgreSQL refuses in a publication filter for
syntactic reasons (subqueries, window functions, parameters) are rejected here with their
position; the prefix forms are in ``terms``, the grammar's tables in ``grammar``; everything else
about validity is ``check``'s job.
"""

from __future__ import annotations

from . import lexer as L
from .grammar import (_ADD, _AND, _AT, _CAST, _CMP, _CMP_OPS, _COLLATE, _IS, _LIKE, _MUL, _OP,
                      _OR, _POW, _SUB)
from .nodes import AnyAll, Between, Binary, Collate, Distinct, InList, IsTest, Node, TypeCast
from .terms import _Terms


def parse(text: str) -> Node:
    return _Parser(text).parse_all()


class _Parser(_Terms):
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
