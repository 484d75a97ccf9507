"""The sink in exactly-once mode: whole source transactions per Kafka transaction, with
the router's progress (``router.delivery.exactly_once``, ``actors.kafka.transactional``).

Rules (on top of ``SinkActor``'s):

* A source transaction whose end LSN is not past the progress Kafka held when this run
  started (``client.committed_lsn`` as the sink is made) is registered and reported done
  without sending its records: an earlier run committed them. Not the progress this run
  commits since: the chunks of an initial snapshot all end at the slot's consistent point,
  and once one Kafka transaction of them committed (every ``interval``) the rest would look
  delivered — they were dropped and the snapshot never finished (their tickets never added
  up).
* The Kafka transaction is committed only between source transactions (none half sent: not
  between the parts of one produced while it arrives, ``router.stream.transactions``),
  once ``interval`` seconds passed since its first record (what arrives before joins it): a
  stream of small transactions shares one Kafka transaction, a large one has its own.
* Records are reported durable (``Acked``, then the slot is confirmed) only by the commit.
* On drain the open Kafka transaction is committed.
"""

from __future__ import annotations

import logging
from typing import cast

import msgspec
import trio

from router.delivery.exactly_once import Stream, already_in_kafka, transactional_id
from router.postgres.lsn import format_lsn
from router.routing.change_router import RoutedChunk

from ..kafka.contracts import Producer, TransactionalProducer
from ..services import log
from .formats import RecordFormat, record_format
from .sink import SinkActor

_log = log.get("sink")
#: seconds between looks at the inbox while a Kafka transaction waits for more
IDLE_POLL = 0.005


class TransactionalSinkActor(SinkActor):
    queues_plain_chunks = False  # every chunk is looked at: Kafka may hold it already

    def __init__(self, *, client: TransactionalProducer, interval: float = 0.1, **kwargs):
        super().__init__(client=client, **kwargs)
        self.client: TransactionalProducer = client
        self.interval = interval
        self._sealed_end: int | None = None  # end LSN of the last whole source transaction
        self._began: float | None = None
        self.skipped = 0  # source transactions Kafka already held
        #: the progress Kafka held before this run: what an earlier run committed
        self.resumed_at = client.committed_lsn

    async def _chunk(self, chunk: RoutedChunk, batch: list) -> None:
        # end LSN 0: a non-transactional logical message, which confirms nothing, or a part
        # of a transaction still arriving, held by Kafka when its commit record starts before
        # the progress Kafka holds (no other transaction ends inside that record)
        resumed = self.resumed_at
        if chunk.records and (already_in_kafka(chunk.end_lsn, resumed) if chunk.end_lsn
                              else not chunk.last and chunk.commit_lsn < resumed):
            if chunk.last:
                if not self.skipped:
                    log.event(_log, "skipping source transactions Kafka already holds",
                              up_to_lsn=format_lsn(self.resumed_at))
                self.skipped += 1
            chunk = msgspec.structs.replace(chunk, records=[])
            self.fmt(chunk)  # its schemas are still learned
        if self._began is None and chunk.records:
            self._began = trio.current_time()
        await super()._chunk(chunk, batch)
        if chunk.last:
            self._sealed_end = chunk.end_lsn

    def _abandon(self) -> None:
        log.event(_log, "input ended inside a source transaction: the open Kafka transaction "
                  "is not committed; its source transactions are sent again by the next run",
                  level=logging.WARNING)
        with self._lock:
            self._txns.clear()
        self._current, self._in_txn, self._sealed_end = None, False, None

    async def _group_done(self) -> None:
        if self._in_txn or self._sealed_end is None:
            return
        inbox = self.inbox.statistics
        if self._began is not None:
            # until the interval is over, what arrives joins this Kafka transaction (one
            # commit for many small source transactions, even when they trickle in)
            while trio.current_time() - self._began < self.interval:
                if inbox().current_buffer_used or inbox().open_send_channels == 0:
                    return
                await trio.sleep(IDLE_POLL)
        await self._commit()

    async def _commit(self) -> None:
        end, self._sealed_end, self._began = self._sealed_end, None, None
        if end is not None and self.client.in_transaction:
            await trio.to_thread.run_sync(self._commit_leading, end)

    def _commit_leading(self, end: int) -> None:
        # with [ha] a router that lost its lease never commits: its open transaction is
        # aborted by the next leader's init_transactions, which also fences this producer
        self._check_lease()
        self.client.commit(end)

    async def _consume(self) -> None:
        await super()._consume()
        if not self._in_txn:
            if self._sealed_end is not None:
                await self._commit()
        # else the input ended (a drain) inside a source transaction produced in parts: the
        # open Kafka transaction is never committed (the next producer with this id aborts
        # it), and every source transaction in it is sent again (``_abandon``)
        if self.skipped:
            log.event(_log, "skipped transactions Kafka already held", count=self.skipped)


def sink_for(cfg, *, client: Producer, fmt: RecordFormat | None = None,
             **kwargs) -> SinkActor:
    """The sink actor for ``cfg``: at-least-once unless ``[kafka] exactly_once``, in Kafka
    transactions also with ``[ha]`` (``actors.kafka.fencing``; ``client`` is then a
    ``TransactionalProducer``); records encoded by ``fmt`` (``formats.record_format(cfg)``
    when not given). ``kwargs``: ``SinkActor``'s."""
    fmt = fmt if fmt is not None else record_format(cfg)
    if cfg.kafka.exactly_once or cfg.ha.enabled:
        # ``client_for`` made it transactional for this same config
        return TransactionalSinkActor(client=cast(TransactionalProducer, client), fmt=fmt,
                                      interval=cfg.kafka.transaction_interval_ms / 1000,
                                      **kwargs)
    return SinkActor(client=client, fmt=fmt, **kwargs)


def client_for(cfg, stream: Stream, wal_end):
    """The Kafka client ``[kafka]`` asks for (transactional with ``exactly_once``: its progress
    belongs to ``stream``, and none lies past the server's ``wal_end``: an LSN, or a function
    reading it after the progress)."""
    if cfg.kafka.exactly_once:
        return transactional_client(cfg, stream, wal_end)
    if cfg.ha.enabled:  # at-least-once, fenced by Kafka after a failover
        from ..kafka.fencing import fencing_client

        client = fencing_client(cfg, stream)
        log.event(_log, "[ha]: Kafka transactions, so a new leader fences this producer",
                  transactional_id=client.transactional_id)
        return client
    return plain_client(cfg)


def plain_client(cfg):
    """The configured client without transactions (at-least-once: a record sent twice is
    identical, at the same position)."""
    from ..kafka import open_producer

    return open_producer(cfg)


def transactional_client(cfg, stream: Stream, wal_end):
    """The configured client with a transactional id, started: the progress Kafka holds
    is read after the id fenced any predecessor (blocking; run in a worker thread)."""
    from ..kafka import open_producer
    from ..kafka.transactional import TransactionalClient, committed_reader

    k = cfg.kafka
    tid = transactional_id(k.transactional_id, stream)
    inner = open_producer(cfg, tid)
    client = TransactionalClient(inner, transactional_id=tid, committed_lsn_topic=k.committed_lsn_topic,
                                 stream=stream, wal_end=wal_end,
                                 read_committed=committed_reader(k.bootstrap_servers,
                                                                 dict(k.settings)),
                                 transaction_timeout_ms=int(k.settings.get(
                                     "transaction_timeout_ms", 60_000)))
    try:
        rf = max((r.topic_settings.replication_factor for r in cfg.routes), default=1)
        committed = client.start(rf)
    except BaseException:
        inner.close(1.0)
        raise
    if client.unattributed is not None:
        log.event(_log, "the committed-LSN record under this transactional id does not say which "
                  "server, database and slot it belongs to (an older pgrouter wrote it): not "
                  "used, so transactions Kafka holds past the slot's confirmed position are "
                  "sent once more", level=logging.WARNING, transactional_id=tid,
                  up_to_lsn=client.unattributed.end_lsn)
    log.event(_log, "exactly-once: Kafka transactions", transactional_id=tid,
              committed_lsn_topic=k.committed_lsn_topic, kafka_committed_lsn=format_lsn(committed))
    return client
