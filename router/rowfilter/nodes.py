"""Syntax tree of a row filter, as written (before types are resolved).

Nodes are frozen dataclasses; ``pos`` is the 0-based offset of the construct in the filter
text, turned into line/column only when an error is reported.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Node:
    pos: int


@dataclass(frozen=True, slots=True)
class Column(Node):
    name: str


@dataclass(frozen=True, slots=True)
class Const(Node):
    kind: str  # "int" | "numeric" | "string" | "bool" | "null"
    value: object  # str for int/numeric/string, bool, None


@dataclass(frozen=True, slots=True)
class TypeName(Node):
    name: str  # canonical, e.g. "integer", "character varying", "timestamp with time zone"
    mods: tuple[int, ...] = ()
    array: bool = False


@dataclass(frozen=True, slots=True)
class TypeCast(Node):
    arg: Node
    type: TypeName


@dataclass(frozen=True, slots=True)
class Unary(Node):
    op: str  # "-", "+", "not"
    arg: Node


@dataclass(frozen=True, slots=True)
class Binary(Node):
    op: str  # an operator symbol, or "and" / "or"
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class IsTest(Node):
    arg: Node
    what: str  # "null" | "true" | "false" | "unknown"
    negated: bool


@dataclass(frozen=True, slots=True)
class Distinct(Node):
    left: Node
    right: Node
    negated: bool  # IS NOT DISTINCT FROM


@dataclass(frozen=True, slots=True)
class InList(Node):
    arg: Node
    items: tuple[Node, ...]
    negated: bool


@dataclass(frozen=True, slots=True)
class Between(Node):
    arg: Node
    low: Node
    high: Node
    negated: bool
    symmetric: bool


@dataclass(frozen=True, slots=True)
class AnyAll(Node):
    op: str
    left: Node
    right: Node
    all: bool


@dataclass(frozen=True, slots=True)
class ArrayExpr(Node):
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class FuncCall(Node):
    name: str
    args: tuple[Node, ...]
    schema: str | None = None


@dataclass(frozen=True, slots=True)
class Case(Node):
    arg: Node | None
    whens: tuple[tuple[Node, Node], ...]
    default: Node | None


@dataclass(frozen=True, slots=True)
class Collate(Node):
    arg: Node
    collation: str
