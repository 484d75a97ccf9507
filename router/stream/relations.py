"""The relation cache: what pgoutput told us about relations and types so far.

Rules (after jackc/pglogrepl: the cache is the caller's, not hidden decoder state):

* A Relation message replaces everything known about its ``relation_id``: pgoutput sends one
  before the first change of a relation in each session and again after every schema change,
  so the latest one describes the changes that follow it. Keep a reference to the struct if
  you need the layout a change was decoded with (the transaction assembler does).
* Type messages name non-built-in types (enums, domains, composites, extension types) used by
  later Relations; built-in types are named from a static table.
* Every Relation applied is also appended to ``fresh`` until the owner takes the list: the
  pipeline looks up the primary keys of relations it does not know there (``router.routing.keys``).
* Asking for a relation never described is a ``ProtocolViolation``: pgoutput guarantees the
  Relation message comes first.
"""

from __future__ import annotations

from ..errors import ProtocolViolation
from ..pgoutput.messages import Relation, Type
from ..postgres.type_names import BUILTIN_TYPES


class RelationCache:
    __slots__ = ("_relations", "_types", "fresh")

    def __init__(self) -> None:
        self._relations: dict[int, Relation] = {}
        self._types: dict[int, Type] = {}
        #: Relations applied since the owner last took this list
        self.fresh: list[Relation] = []

    def apply(self, msg: Relation | Type) -> None:
        if type(msg) is Relation:
            self._relations[msg.relation_id] = msg
            self.fresh.append(msg)
        elif type(msg) is Type:
            self._types[msg.type_oid] = msg
        else:
            raise TypeError(f"RelationCache.apply takes Relation or Type, not {type(msg).__name__}")

    def take_fresh(self) -> list[Relation]:
        fresh, self.fresh = self.fresh, []
        return fresh

    def get(self, relation_id: int) -> Relation:
        try:
            return self._relations[relation_id]
        except KeyError:
            raise ProtocolViolation(f"change for relation {relation_id} before its Relation "
                                    "message") from None

    @property
    def by_id(self) -> dict[int, Relation]:
        """The relations by id (read-only use: ``apply`` is the only writer)."""
        return self._relations

    def __contains__(self, relation_id: int) -> bool:
        return relation_id in self._relations

    def __len__(self) -> int:
        return len(self._relations)

    def type_name(self, oid: int) -> str | None:
        """``int4`` for built-ins, ``namespace.name`` for types announced by a Type message
        (just ``name`` when the namespace is pg_catalog), ``None`` if unknown."""
        typ = self._types.get(oid)
        if typ is not None:
            return typ.name if typ.namespace == "pg_catalog" else f"{typ.namespace}.{typ.name}"
        return BUILTIN_TYPES.get(oid)

    def type(self, oid: int) -> Type | None:
        return self._types.get(oid)
