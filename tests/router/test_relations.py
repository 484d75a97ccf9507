"""RelationCache: latest Relation wins, Type names, unknown relations are violations."""

from __future__ import annotations

import pytest

from router.errors import ProtocolViolation
from router.pgoutput import Insert, Relation, RelationColumn, Type
from router.stream.relations import RelationCache

REL = Relation(7, "s", "t", "f", (RelationColumn(1, "id", 23, -1),
                                  RelationColumn(1, "mood", 16390, -1)))


def test_apply_and_get():
    cache = RelationCache()
    assert 7 not in cache
    cache.apply(REL)
    assert cache.get(7) is REL and 7 in cache and len(cache) == 1
    newer = Relation(7, "s", "t", "d", REL.columns[:1])
    cache.apply(newer)
    assert cache.get(7) is newer and newer.key_columns == ("id",)


def test_unknown_relation_is_a_violation():
    with pytest.raises(ProtocolViolation):
        RelationCache().get(99)


def test_type_names():
    cache = RelationCache()
    assert cache.type_name(23) == "int4" and cache.type_name(1184) == "timestamptz"
    assert cache.type_name(16390) is None
    cache.apply(Type(16390, "golden", "mood"))
    assert cache.type_name(16390) == "golden.mood"
    cache.apply(Type(16391, "pg_catalog", "weird"))
    assert cache.type_name(16391) == "weird"
    assert cache.type(16390).name == "mood"


def test_apply_rejects_other_messages():
    with pytest.raises(TypeError):
        RelationCache().apply(Insert(1, ()))
