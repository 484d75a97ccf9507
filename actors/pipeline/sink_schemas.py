"""The sink's schemas (``sink.SinkActor`` holds one ``Schemas``): the registry ids a record
format needs before its records are converted (Avro), and the table schemas published on
the schema topic before the first record naming them."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from router.formats.avro import SchemasNeeded
from router.routing.change_router import RoutedChunk
from router.formats.schema import encode_schema
from router.routing.topics import TopicSpec

from ..kafka.contracts import Producer
from ..kafka.registry import RegistryUnavailable
from ..services import log
from .formats import RecordFormat

_log = log.get("sink")


class Schemas:
    def __init__(self, *, client: Producer, fmt: RecordFormat, topic: str,
                 replication_factor: int, create_topic: bool,
                 check_lease: Callable[[], None]):
        self.client = client
        self.fmt = fmt
        self.topic = topic  # the schema topic
        self.replication_factor = replication_factor
        self.create_topic = create_topic
        #: raises when the router may hand nothing more over (``SinkActor._check_lease``)
        self.check_lease = check_lease
        self._topic_ready = False

    async def produce_converted(self, batch: list,
                                produce_from: Callable[[list, int], tuple | None]) -> None:
        """``produce_from(batch, start)`` in a worker thread until every entry of ``batch`` is
        handed over: where it stops (returning ``(index, subjects)``: the first entry whose
        schemas have no id yet), those are registered and it goes on from there."""
        start = 0
        while True:
            stopped = await trio.to_thread.run_sync(produce_from, batch, start)
            if stopped is None:
                return
            start, subjects = stopped
            await self.register(subjects)

    async def encoded(self, chunk: RoutedChunk) -> list:
        """The chunk's records encoded, their schemas registered first where needed."""
        while True:
            try:
                return self.fmt(chunk)
            except SchemasNeeded as need:
                await self.register(need.subjects)

    async def register(self, subjects) -> None:
        """``subjects`` registered (in a worker thread), retried while the registry cannot be
        reached; a schema it refuses raises."""
        delay = 0.5
        while True:
            try:
                await trio.to_thread.run_sync(self.fmt.register, subjects)
                return
            except RegistryUnavailable as exc:
                log.event(_log, "schema registry unavailable, retrying", error=str(exc),
                          retry_in=f"{delay:g}s", level=logging.WARNING)
                await trio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def publish(self, schemas) -> None:
        """The table schemas on the schema topic (made compacted before the first)."""
        if not self._topic_ready and self.create_topic:
            await trio.to_thread.run_sync(self.client.ensure_topics, [TopicSpec(
                self.topic, 1, self.replication_factor, {"cleanup.policy": "compact"})])
        self._topic_ready = True
        for schema in schemas:
            key, value = encode_schema(schema)
            self.check_lease()
            await trio.to_thread.run_sync(self.client.produce_sync, self.topic, key, value)
            log.event(_log, "schema published", schema_id=schema.schema_id,
                      table=f"{schema.schema}.{schema.table}", topic=self.topic)
