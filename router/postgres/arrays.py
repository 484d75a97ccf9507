"""PostgreSQL's text form of an array (``array_out``/``array_in``): the one parser of array
literals, for row filter constants, Kafka Connect records and the materializer's Spark
arrays (which ship this module to the executors: it imports nothing).

Rules:

* One dimension: ``{1,2,NULL,"a b"}``, optionally with explicit bounds (``[0:1]={7,8}``).
  Elements come back as their texts, ``None`` for an unquoted NULL (any case, as
  ``array_in`` reads it); a quoted ``"NULL"`` is the text.
* Quoted elements keep everything between the quotes, with ``\\`` escaping the next
  character; unquoted elements are trimmed and may escape a character with ``\\`` too.
* A nested array (``{{1,2},{3,4}}``) raises ``NestedArray`` unless ``nested=True``, which
  returns each inner array as its literal text.
* Anything else raises ``ValueError`` quoting the literal.
"""

from __future__ import annotations


class NestedArray(ValueError):
    """A multi-dimensional array where one dimension is expected."""


def array_items(text: str, *, nested: bool = False) -> list[str | None]:
    """The element texts of the array literal ``text``."""
    s = text.strip()
    if s.startswith("["):  # explicit bounds
        s = s[s.index("=") + 1:].strip() if "=" in s else s
    if not (s.startswith("{") and s.endswith("}")):
        raise ValueError(f'malformed array literal: "{text[:60]}"')
    body = s[1:-1]
    if not body.strip():
        return []
    items: list[str | None] = []
    i, n = 0, len(body)
    while i <= n:
        while i < n and body[i].isspace():
            i += 1
        if i < n and body[i] == "{":
            if not nested:
                raise NestedArray("multi-dimensional arrays are not supported")
            depth, start = 0, i
            while i < n:
                depth += {"{": 1, "}": -1}.get(body[i], 0)
                i += 1
                if depth == 0:
                    break
            if depth:
                raise ValueError(f'malformed array literal: "{text[:60]}"')
            items.append(body[start:i])
        elif i < n and body[i] == '"':
            i += 1
            buf: list[str] = []
            while i < n and body[i] != '"':
                if body[i] == "\\" and i + 1 < n:
                    i += 1
                buf.append(body[i])
                i += 1
            if i >= n:
                raise ValueError(f'malformed array literal: "{text[:60]}"')
            i += 1
            items.append("".join(buf))
        else:
            buf = []
            while i < n and body[i] != ",":
                if body[i] == "\\" and i + 1 < n:
                    i += 1
                elif body[i] in '"{}':
                    raise ValueError(f'malformed array literal: "{text[:60]}"')
                buf.append(body[i])
                i += 1
            raw = "".join(buf).strip()
            if not raw:
                raise ValueError(f'malformed array literal: "{text[:60]}"')
            items.append(None if raw.upper() == "NULL" else raw)
        while i < n and body[i].isspace():
            i += 1
        if i < n and body[i] != ",":
            raise ValueError(f'malformed array literal: "{text[:60]}"')
        i += 1
    return items
