"""Routes as the core sees them (``RouteSpec``) and what routing a transaction yields
(``RoutedChunk``): the records of one route-set for Kafka, in chunks, with the table schemas
the sink must make durable first. ``router.routing.change_router`` does the routing."""

from __future__ import annotations

import fnmatch
from typing import Callable

import msgspec

from ..errors import ConfigError
from ..pgoutput import Relation
from ..formats.schema import TableSchema
from .topics import illegal, topic_name

#: (topic, key, value, headers)
Record = tuple


class RoutedChunk(msgspec.Struct):
    xid: int
    commit_lsn: int
    end_lsn: int
    records: list
    schemas: list[TableSchema]
    last: bool  # the transaction's final chunk
    #: topics this router had not used before, with the route that writes them
    new_topics: list[tuple[str, str]] = []


class RouteSpec(msgspec.Struct, frozen=True):
    """A route as the core sees it. ``planner`` builds the plan for a relation the route
    takes (or returns None to skip it); the default planner handles config routes."""

    name: str
    tables: frozenset[tuple[str, str]] = frozenset()
    schemas: frozenset[str] = frozenset()
    all_tables: bool = False
    operations: frozenset[str] = frozenset({"insert", "update", "delete", "truncate"})
    topic: str = "{route}.{schema}.{table}"
    planner: Callable[[Relation], dict | None] | None = None
    #: a tombstone after each delete record (``router.formats.tombstones``)
    tombstones: bool = False
    #: column transforms (``router.routing.transforms.ColumnTransform``) and whether key columns may
    #: be transformed
    transforms: tuple = ()
    transform_keys: bool = False
    #: ``router.routing.outbox.OutboxConfig`` of an outbox route (its tables' inserts are events)
    outbox: object | None = None

    def takes(self, schema: str, table: str) -> bool:
        if self.all_tables:
            return True
        if (schema, table) in self.tables:
            return True
        return any(fnmatch.fnmatchcase(schema, s) for s in self.schemas)

    def topic_for(self, schema: str, table: str) -> str:
        """The topic of a table (``router.routing.topics``: identifiers escaped); a ``ConfigError``
        when Kafka would refuse the name (a table created after ``check`` ran)."""
        topic = topic_name(self.topic, self.name, schema, table)
        problem = illegal(topic)
        if problem:
            raise ConfigError(f"route {self.name!r}, table {schema}.{table}: topic {problem}",
                              path="routes.topic")
        return topic
