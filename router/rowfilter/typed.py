"""Typed expression tree: what ``check.py`` produces and ``compile.py`` turns into closures.

Every node has its PostgreSQL result type and the offset of the construct it came from.
Operators, casts and functions all become ``Call`` (strict: NULL in → NULL out, arguments are
evaluated before the NULL check, as PostgreSQL's executor does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .types import PgType


@dataclass(frozen=True, slots=True, eq=False)
class TNode:
    type: PgType
    pos: int


@dataclass(frozen=True, slots=True, eq=False)
class Col(TNode):
    index: int  # position in the row
    name: str


@dataclass(frozen=True, slots=True, eq=False)
class Lit(TNode):
    value: Any  # None for NULL


@dataclass(frozen=True, slots=True, eq=False)
class Call(TNode):
    name: str
    fn: Callable
    args: tuple[TNode, ...]


@dataclass(frozen=True, slots=True, eq=False)
class BoolOp(TNode):
    op: str  # "and" | "or"
    args: tuple[TNode, ...]


@dataclass(frozen=True, slots=True, eq=False)
class Not(TNode):
    arg: TNode


@dataclass(frozen=True, slots=True, eq=False)
class NullTest(TNode):
    arg: TNode
    negated: bool


@dataclass(frozen=True, slots=True, eq=False)
class BoolTest(TNode):
    arg: TNode
    what: str  # "true" | "false" | "unknown"
    negated: bool


@dataclass(frozen=True, slots=True, eq=False)
class IsDistinct(TNode):
    left: TNode
    right: TNode
    eq: Callable
    negated: bool


@dataclass(frozen=True, slots=True, eq=False)
class CaseWhen(TNode):
    whens: tuple[tuple[TNode, TNode], ...]
    default: TNode


@dataclass(frozen=True, slots=True, eq=False)
class Coalesce(TNode):
    args: tuple[TNode, ...]


@dataclass(frozen=True, slots=True, eq=False)
class NullIf(TNode):
    left: TNode
    right: TNode
    eq: Callable


@dataclass(frozen=True, slots=True, eq=False)
class MinMax(TNode):
    args: tuple[TNode, ...]
    greatest: bool
    key: Callable


@dataclass(frozen=True, slots=True, eq=False)
class ArrayOp(TNode):
    left: TNode
    array: TNode  # an Array, or any expression of array type
    cmp: Callable
    all: bool


@dataclass(frozen=True, slots=True, eq=False)
class Array(TNode):
    items: tuple[TNode, ...]
