"""The sink's hand-over of queued records to the Kafka client (``SinkActor``'s part): on
trio's thread for a few records when the client can take them at once, else in a worker
thread; with a format that registers (Avro), converted in the producing thread first; with
``[ha]``, never after the leadership lease expired. A record too large for an outbox topic
is named by its route and table."""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter

import trio

from router.delivery.tally import record_too_large
from router.errors import LeadershipLost, RecordTooLarge
from router.formats.avro import SchemasNeeded

from ..kafka.contracts import Rest

#: a hand-over of at most this many records runs on trio's thread when the client can hand
#: over without waiting (``produce_now``): a trickle of small transactions pays no thread
#: round trip; what the local queue cannot take at once still waits in a worker thread
INLINE_RECORDS = 256


class HandOver:
    """Uses the ``SinkActor``'s client, format, lock, tickets, counters and ``holds``."""

    def _described(self, error: BaseException) -> BaseException:
        """A record-too-large error for an outbox topic names its route and table (its
        record has no envelope to name the table)."""
        record, limits = getattr(error, "record", None), getattr(error, "limits", {})
        owner = self.owners.owner(record[0]) if record and self.owners else None
        if record is None or owner is None:
            return error
        described = record_too_large(*record[:3], headers=record[3], owner=owner, **limits)
        described.__cause__ = error.__cause__
        return described

    async def _produce(self, batch: list) -> None:
        await self._flush_tickets()
        if not batch:
            return
        try:
            await self._hand_over(batch)
        except RecordTooLarge as exc:
            raise self._described(exc) from exc.__cause__

    async def _hand_over(self, batch: list) -> None:
        started = perf_counter()
        if self._defer:
            await self.schemas.produce_converted(batch, self._convert_produce)
        elif self._now is not None and sum(len(r) for r, _ in batch) <= INLINE_RECORDS:
            await self._produce_now(self._now, batch)
        elif len(batch) == 1 and self.holds is None:
            records, ticket = batch[0]
            await trio.to_thread.run_sync(self.client.produce, records, ticket, self._on_delivery)
        else:
            await trio.to_thread.run_sync(self._produce_all, batch)
        if self.metrics is not None:
            self.metrics.stage_seconds.labels("produce").observe(perf_counter() - started)
            for records, _ in batch:
                self.metrics.produced(records)
        if self.stats is not None:
            self.stats.sent_records += self._sent_records
        self._sent_records = 0
        batch.clear()

    def _check_lease(self) -> None:
        """With ``[ha]``, in the producing thread right before records go: a router whose
        leadership lease expired hands nothing more over (router.delivery.ha)."""
        if self.holds is not None and not self.holds():
            raise LeadershipLost("leadership lost: records not produced")

    def _produce_all(self, batch: list, start: int = 0) -> None:
        self._check_lease()
        produce, on_delivery = self.client.produce, self._on_delivery
        for i in range(start, len(batch)):
            records, ticket = batch[i]
            produce(records, ticket, on_delivery)

    def _convert_produce(self, batch: list, start: int) -> tuple | None:
        """``_produce_all`` from ``batch[start]`` on, each entry's records converted first
        (producing thread): None when all are handed over, or (index, subjects) of the first
        entry whose schemas have no id yet (nothing of it handed over). A conversion that
        makes more records than the router's (a key change is two) counts them into its
        ticket before they go, so the ticket cannot complete early."""
        self._check_lease()
        convert, produce, on_delivery = self.fmt.convert, self.client.produce, self._on_delivery
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

    async def _produce_now(self, now: Callable[..., Rest | None], batch: list) -> None:
        self._check_lease()
        on_delivery = self._on_delivery
        for i, (records, ticket) in enumerate(batch):
            rest = now(records, ticket, on_delivery)
            if rest is not None:  # the local queue is full: wait for room in a thread
                await trio.to_thread.run_sync(rest)
                await trio.to_thread.run_sync(self._produce_all, batch, i + 1)
                return
