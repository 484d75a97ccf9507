"""The sink's schema side (``sink.SinkActor``'s base): records converted to a format that
names schemas by registry id (Avro) before they are handed over, their schemas registered
first; the table schemas published on the schema topic before the first record naming them."""

from __future__ import annotations

import logging

import trio

from router.avro import SchemasNeeded
from router.routing import RoutedChunk
from router.schema import encode_schema
from router.topics import TopicSpec

from ..kafka.registry import RegistryUnavailable
from ..services import log

_log = log.get("sink")


class SchemaSide:
    async def _convert_and_produce(self, batch: list) -> None:
        start = 0
        while True:
            stopped = await trio.to_thread.run_sync(self._convert_produce, batch, start)
            if stopped is None:
                return
            start, subjects = stopped
            await self._register_schemas(subjects)

    def _convert_produce(self, batch: list, start: int):
        """``_produce_all`` from ``batch[start]`` on, each entry's records converted first
        (producing thread): None when all are handed over, or (index, subjects) of the first
        entry whose schemas have no id yet (nothing of it handed over). A conversion that
        makes more records than the router's (a key change is two) counts them into its
        ticket before they go, so the ticket cannot complete early."""
        self._check_lease()
        convert, produce, on_delivery = self.reshape.convert, self.client.produce, self._on_delivery
        for i in range(start, len(batch)):
            raw, ticket = batch[i]
            try:
                records = convert(raw)
            except SchemasNeeded as need:
                return i, need.subjects
            extra = len(records) - len(raw)
            if extra:
                with self._lock:
                    self._txns[ticket].sent += extra
                self._sent_records += extra
            batch[i] = (records, ticket)
            produce(records, ticket, on_delivery)
        return None

    async def _registered(self, chunk: RoutedChunk) -> list:
        """The chunk's records encoded, their schemas registered first where needed."""
        while True:
            try:
                return self.reshape(chunk)
            except SchemasNeeded as need:
                await self._register_schemas(need.subjects)

    async def _register_schemas(self, subjects) -> None:
        """``subjects`` registered (in a worker thread), retried while the registry cannot be
        reached; a schema it refuses raises."""
        delay = 0.5
        while True:
            try:
                await trio.to_thread.run_sync(self.reshape.register, subjects)
                return
            except RegistryUnavailable as exc:
                log.event(_log, "schema registry unavailable, retrying", error=str(exc),
                          retry_in=f"{delay:g}s", level=logging.WARNING)
                await trio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _send_schemas(self, schemas) -> None:
        if not self._schema_ready and self.create_topics:
            await trio.to_thread.run_sync(self.client.ensure_topics, [TopicSpec(
                self.schema_topic, 1, self.topic_specs.get("", TopicSpec("")).replication_factor,
                {"cleanup.policy": "compact"})])
        self._schema_ready = True
        for schema in schemas:
            key, value = encode_schema(schema)
            self._check_lease()
            await trio.to_thread.run_sync(self.client.produce_sync, self.schema_topic, key, value)
            log.event(_log, "schema published", schema_id=schema.schema_id,
                      table=f"{schema.schema}.{schema.table}", topic=self.schema_topic)
