"""Tokenizer for the SQL expression subset PostgreSQL accepts in publication ``WHERE`` clauses.

Rules kept (from PostgreSQL's ``scan.l``):

* unquoted identifiers and keywords fold to lower case; ``"Quoted"`` ones keep their case and
  ``""`` stands for one ``"``;
* ``'...'`` strings double ``''`` for a quote; ``E'...'`` strings take backslash escapes;
  adjacent string literals separated by a newline are concatenated;
* an operator is the longest run of ``+-*/<>=~!@#%^&|`?``; a trailing ``+``/``-`` is split off
  unless the run contains one of ``~!@#%^&|`?`` (so ``a>-5`` is ``>`` then ``-``); ``--`` and
  ``/*`` start comments;
* numbers: ``123`` is an integer, ``1.5``, ``.5``, ``1e10`` are numeric.

Every token carries its 0-based offset; ``position()`` turns it into (line, column), 1-based.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.errors import FilterError

IDENT, QIDENT, INT, NUMERIC, STRING, OP, PUNCT, EOF = (
    "ident", "qident", "int", "numeric", "string", "op", "punct", "eof")

_OP_CHARS = set("+-*/<>=~!@#%^&|`?")
_NON_MATH_OP_CHARS = set("~!@#%^&|`?")
_PUNCT = set("()[],.;:")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    value: str
    offset: int


def position(text: str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of ``offset`` in ``text``."""
    line = text.count("\n", 0, offset) + 1
    start = text.rfind("\n", 0, offset) + 1
    return line, offset - start + 1


def error(text: str, offset: int, message: str) -> FilterError:
    line, column = position(text, offset)
    return FilterError(message, line=line, column=column, expression=text)


_E_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
        elif text.startswith("/*", i):
            i = _skip_block_comment(text, i)
        elif ch in "eE" and i + 1 < n and text[i + 1] == "'":
            value, i2 = _read_string(text, i + 1, escapes=True)
            tokens.append(Token(STRING, value, i))
            i = i2
        elif ch == "'":
            value, i2 = _read_string(text, i, escapes=False)
            tokens.append(Token(STRING, value, i))
            i = i2
        elif ch == '"':
            j = i + 1
            parts = []
            while True:
                k = text.find('"', j)
                if k < 0:
                    raise error(text, i, "unterminated quoted identifier")
                parts.append(text[j:k])
                if text.startswith('""', k):
                    parts.append('"')
                    j = k + 2
                    continue
                i2 = k + 1
                break
            name = "".join(parts)
            if not name:
                raise error(text, i, "zero-length delimited identifier")
            tokens.append(Token(QIDENT, name, i))
            i = i2
        elif ch.isdigit() or (ch == "." and i + 1 < n and text[i + 1].isdigit()):
            tokens.append(_read_number(text, i))
            i = tokens[-1].offset + len(tokens[-1].value)
        elif ch.isalpha() or ch == "_" or ord(ch) > 127:
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] in "_$" or ord(text[j]) > 127):
                j += 1
            tokens.append(Token(IDENT, text[i:j].lower(), i))
            i = j
        elif ch == ":" and text.startswith("::", i):
            tokens.append(Token(OP, "::", i))
            i += 2
        elif ch in _PUNCT:
            tokens.append(Token(PUNCT, ch, i))
            i += 1
        elif ch in _OP_CHARS:
            j = i
            while j < n and text[j] in _OP_CHARS:
                if text.startswith("--", j) or text.startswith("/*", j):
                    break
                j += 1
            op = text[i:j]
            if len(op) > 1 and op[-1] in "+-" and not (set(op) & _NON_MATH_OP_CHARS):
                op = op.rstrip("+-") or op[0]
            tokens.append(Token(OP, "<>" if op == "!=" else op, i))
            i += len(op)
        elif ch == "$":
            raise error(text, i, "parameters and dollar-quoted strings are not allowed in a row filter")
        else:
            raise error(text, i, f"syntax error at or near {ch!r}")
    tokens.append(Token(EOF, "", n))
    return tokens


def _skip_block_comment(text: str, i: int) -> int:
    depth, j = 0, i
    while j < len(text):
        if text.startswith("/*", j):
            depth += 1
            j += 2
        elif text.startswith("*/", j):
            depth -= 1
            j += 2
            if depth == 0:
                return j
        else:
            j += 1
    raise error(text, i, "unterminated /* comment")


def _read_string(text: str, i: int, *, escapes: bool) -> tuple[str, int]:
    """Read a quoted string starting at the quote ``text[i]``; returns (value, next offset)."""
    start = i
    out: list[str] = []
    j = i + 1
    n = len(text)
    while True:
        if j >= n:
            raise error(text, start, "unterminated quoted string")
        c = text[j]
        if c == "'":
            if j + 1 < n and text[j + 1] == "'":
                out.append("'")
                j += 2
                continue
            j += 1
            # 'foo'\n'bar' is one literal (whitespace with a newline between the parts)
            k = j
            while k < n and text[k] in " \t\r\f\n":
                k += 1
            if k < n and text[k] == "'" and "\n" in text[j:k]:
                j = k + 1
                continue
            return "".join(out), j
        if escapes and c == "\\" and j + 1 < n:
            d = text[j + 1]
            if d in _E_ESCAPES:
                out.append(_E_ESCAPES[d])
                j += 2
            elif d in "01234567":
                k = j + 1
                while k < n and k < j + 4 and text[k] in "01234567":
                    k += 1
                out.append(chr(int(text[j + 1:k], 8)))
                j = k
            elif d == "x":
                k = j + 2
                while k < n and k < j + 4 and text[k] in "0123456789abcdefABCDEF":
                    k += 1
                if k == j + 2:
                    out.append("x")
                    j += 2
                else:
                    out.append(chr(int(text[j + 2:k], 16)))
                    j = k
            elif d in "uU":
                width = 4 if d == "u" else 8
                hexdigits = text[j + 2:j + 2 + width]
                if len(hexdigits) != width or not all(h in "0123456789abcdefABCDEF" for h in hexdigits):
                    raise error(text, j, "invalid Unicode escape")
                out.append(chr(int(hexdigits, 16)))
                j += 2 + width
            else:
                out.append(d)
                j += 2
            continue
        out.append(c)
        j += 1


def _read_number(text: str, i: int) -> Token:
    n = len(text)
    j = i
    while j < n and text[j].isdigit():
        j += 1
    kind = INT
    if j < n and text[j] == "." and not text.startswith("..", j):
        kind = NUMERIC
        j += 1
        while j < n and text[j].isdigit():
            j += 1
    if j < n and text[j] in "eE":
        k = j + 1
        if k < n and text[k] in "+-":
            k += 1
        if k < n and text[k].isdigit():
            kind = NUMERIC
            j = k
            while j < n and text[j].isdigit():
                j += 1
    if j < n and (text[j].isalpha() or text[j] == "_"):
        raise error(text, i, f"trailing junk after numeric literal at or near {text[i:j + 1]!r}")
    return Token(kind, text[i:j], i)
