"""Column transforms of a route, for personal data: what leaves pgrouter carries a hash, a
mask, a prefix or a null instead of a column's value (``[[routes.transforms]]``).

Rules:

* ``hash``: the SHA-256 hex digest of the salt's UTF-8 bytes followed by the value's text
  form (what PostgreSQL computes as ``encode(sha256(convert_to(salt || value::text,
  'UTF8')), 'hex')``). The salt comes from an environment variable or a file (read by the
  caller, ``actors``): it is held by a ``Salt`` whose repr hides it, never in a schema, a log
  line or a status document.
* ``mask``: a constant string (``mask = "…"``) or ``chars`` asterisks (Debezium's
  ``column.mask.with.N.chars``); ``truncate``: the first ``chars`` characters; ``null``: null.
* A NULL stays NULL (nothing to hide) and an unchanged-TOAST value stays unchanged (the
  consumer keeps the transformed value it holds).
* Types: a hashed, masked or truncated column is published as ``text`` (a hashed ``int``
  becomes a string in every format and schema); a nulled column keeps its type.
* Transforms apply only to what leaves: row filters see PostgreSQL's own values
  (``router.routing.plans`` runs first); the encoder transforms each row it writes
  (``TableEncoder``), for the stream, the initial snapshot and backfills alike.
* A transform of a key column changes the record key and so the partition of the row: it is
  refused unless the route says ``transform_keys = true``.
* Columns are named plainly (every table of the route having it) or ``schema.table.column``.
"""

from __future__ import annotations

import hashlib
from typing import Callable

import msgspec

from ..errors import ConfigError
from ..pgoutput import UNCHANGED_TOAST, Relation, RelationColumn

TEXT = 25
KINDS = ("hash", "mask", "truncate", "null")


class Salt:
    """A hash salt: its bytes, never shown (``repr`` names where it came from)."""

    __slots__ = ("value", "origin")

    def __init__(self, value: bytes, origin: str):
        self.value, self.origin = value, origin

    def __repr__(self) -> str:
        return f"Salt(<hidden, from {self.origin}>)"

    __str__ = __repr__

    def __eq__(self, other) -> bool:
        return isinstance(other, Salt) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.origin)


class ColumnTransform(msgspec.Struct, frozen=True):
    """One ``[[routes.transforms]]`` entry, its salt resolved (``hash``)."""

    kind: str
    columns: tuple[str, ...]
    salt: Salt | None = None
    mask: str | None = None
    chars: int = 0

    def applies(self, schema: str, table: str, column: str) -> bool:
        return column in self.columns or f"{schema}.{table}.{column}" in self.columns

    def function(self) -> Callable[[str], str | None]:
        if self.kind == "hash":
            salt = self.salt.value
            return lambda v: hashlib.sha256(salt + v.encode()).hexdigest()
        if self.kind == "mask":
            masked = self.mask if self.mask is not None else "*" * self.chars
            return lambda v: masked
        if self.kind == "truncate":
            n = self.chars
            return lambda v: v[:n]
        return lambda v: None


def _text(value) -> str:
    # binary-mode values are refused at config load; a bytes value would be bytea's send form
    return value if type(value) is str else "\\x" + value.hex()


class RowTransform:
    """The transforms of one table layout: ``row -> row`` with the transformed columns
    replaced (None stays None)."""

    __slots__ = ("steps",)

    def __init__(self, steps: tuple[tuple[int, Callable], ...]):
        self.steps = steps

    def __call__(self, row: tuple | None) -> tuple | None:
        if row is None:
            return None
        out = list(row)
        for i, fn in self.steps:
            v = out[i]
            if v is not None and v is not UNCHANGED_TOAST:
                out[i] = fn(_text(v))
        return tuple(out)


def for_relation(transforms: tuple[ColumnTransform, ...], relation: Relation, *, route: str,
                 transform_keys: bool) -> tuple[Relation, RowTransform | None]:
    """The layout the encoder publishes (transformed columns retyped) and the row transform
    of ``relation`` on ``route``; ``relation`` itself and None when no column is transformed.
    A transformed key column without ``transform_keys`` is a ``ConfigError``."""
    steps = []
    cols = list(relation.columns)
    for i, col in enumerate(cols):
        t = next((t for t in transforms if t.applies(relation.namespace, relation.name,
                                                       col.name)), None)
        if t is None:
            continue
        if col.flags & 1 and not transform_keys:
            raise ConfigError(
                f"route {route!r}: column {relation.namespace}.{relation.name}.{col.name} is "
                f"part of the record key; a {t.kind} transform of it changes the key and the "
                "partition of every record of the row: set transform_keys = true to accept that",
                path="routes.transforms")
        steps.append((i, t.function()))
        if t.kind != "null":
            cols[i] = RelationColumn(col.flags, col.name, TEXT, -1)
    if not steps:
        return relation, None
    return msgspec.structs.replace(relation, columns=tuple(cols)), RowTransform(tuple(steps))


class TransformConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[[routes.transforms]]``: ``kind`` of transform and the ``columns`` it applies to.
    No key holds a salt: ``hash`` names where to read it (``salt_env`` or ``salt_file``)."""

    kind: str
    columns: list[str]
    salt_env: str = ""
    salt_file: str = ""
    mask: str | None = None
    chars: int = 0


def validate_transforms(transforms: list[TransformConfig], where: str, source: str) -> None:
    """Each entry's kind and what that kind needs, one ``ConfigError`` naming the key."""
    for i, t in enumerate(transforms):
        at = f"{where}.transforms[{i}]"
        if t.kind not in KINDS:
            raise ConfigError(f"kind {t.kind!r}: one of {', '.join(KINDS)}", path=f"{at}.kind",
                              source=source)
        if not t.columns or not all(t.columns):
            raise ConfigError("name at least one column (a name, or schema.table.column)",
                              path=f"{at}.columns", source=source)
        if t.kind == "hash" and bool(t.salt_env) == bool(t.salt_file):
            raise ConfigError("hash reads its salt from salt_env (an environment variable's "
                              "name) or salt_file (a file's path): give exactly one; the salt "
                              "itself never goes in the config", path=at, source=source)
        if t.kind != "hash" and (t.salt_env or t.salt_file):
            raise ConfigError("salt_env and salt_file are for kind = \"hash\"", path=at,
                              source=source)
        if t.kind == "mask" and (t.mask is None) == (t.chars < 1):
            raise ConfigError("mask needs mask = \"<constant>\" or chars = N (≥ 1), not both",
                              path=at, source=source)
        if t.kind == "truncate" and t.chars < 1:
            raise ConfigError("truncate needs chars = N (≥ 1)", path=f"{at}.chars",
                              source=source)
        if t.kind in ("hash", "null") and (t.mask is not None or t.chars):
            raise ConfigError(f"mask and chars are not for kind = {t.kind!r}", path=at,
                              source=source)
