"""The Kafka sink actor: record chunks in, durable acknowledgements out.

Rules (the delivery contract, whichever Kafka client is behind it):

* "Accepted" is not "durable": a transaction is reported ``Acked`` only from Kafka's delivery
  results (acks=all, idempotent producer), never when a send call returns. Records are
  counted per transaction; the transaction is done when it is sealed (its last chunk was
  handed over) and every record is acknowledged. ``stats.acked_records`` grows with every
  acknowledged batch (a client's ``produce`` call), so progress lines move during a huge
  transaction too.
* Transactions are registered with the confirm actor (``Registered``) in commit order, before
  any of their records are sent; keepalives and holds follow on the same channel, so their
  order is kept.
* A table schema is made durable on the schema topic before the first record naming it is
  sent (consumers can always find the schema of a record they read).
* Topics are created (when ``create_topics``) before their first record, with the route's
  partitions, replication factor and configs; the schema topic is compacted. The client's
  ``ensure_topics`` returns once every new partition's leader serves it
  (``actors.kafka.admin.wait_led``): records sent before that could be lost silently.
* A failed delivery fails the sink with a typed ``SinkError`` (the supervisor decides on a
  retry); nothing after it is reported done.
* Records are encoded by the ``RecordFormat`` the sink is given (``formats.record_format``).
  With one that ``registers`` (Avro) a chunk's records are converted before they are
  queued, or in the producing thread when the sink queues chunks as they come; schemas
  without a registry id are registered first (in a worker thread; an unreachable registry
  is retried in place with a line every attempt, a refused schema stops the sink), so no
  record is sent, and no position confirmed, ahead of its schema's id.
* The client is a ``contracts.Producer``; one that is an ``InlineProducer`` hands small
  groups over on trio's thread. The client's blocking calls run in a worker thread; delivery callbacks arrive on the
  client's own thread and are handed to trio with ``run_sync_soon``.
* With ``[ha]`` (``holds``) a router whose leadership lease expired hands no record over
  (checked in the producing thread per hand-over and per schema record; router.delivery.ha).
* Chunks already waiting in the inbox are taken together (a stream of small transactions
  is one chunk per transaction) and their records handed to the client in one worker-thread
  call. Consecutive whole transactions of such a group share one ticket: its ``Registered``
  carries the end LSN of the last of them and is extended while it has not been sent yet;
  the ticket is sealed once its ``Registered`` is sent and no transaction of it is still open, and
  it is ``Acked`` only when every record of every one of its transactions is acknowledged
  (so the flush LSN moves past them all at once, never past one whose records are not all
  durable). A keepalive or hold ends the sharing (it keeps its place between transactions).
"""

from __future__ import annotations

import threading
from collections import deque

import trio

from router.errors import SinkError
from router.routing.change_router import RoutedChunk
from router.routing.topics import TopicFolds, TopicSpec

from ..kafka.contracts import InlineProducer, Producer
from ..services import log
from .formats import JsonRecords, RecordFormat
from .mailbox import Registered, Acked, Hold, Keepalive
from .sink_handover import HandOver
from .sink_schemas import Schemas

_log = log.get("sink")
#: channel items taken together at most (each a chunk of at most CHUNK_RECORDS records)
MAX_GROUP = 64


class _Txn:
    __slots__ = ("sent", "acked", "sealed", "end")

    def __init__(self, end: int):
        self.sent = 0
        self.acked = 0
        self.sealed = False
        self.end = end  # the end LSN registered


class SinkActor(HandOver):
    #: a chunk that needs no topic and no schema made ready is queued by ``_plain_chunk``
    #: (the exactly-once sink looks at every chunk in ``_chunk``)
    queues_plain_chunks = True

    def __init__(self, *, client: Producer, inbox: trio.MemoryReceiveChannel,
                 tickets: trio.MemorySendChannel, schema_topic: str,
                 topic_specs: dict[str, TopicSpec], create_topics: bool = True, stats=None,
                 metrics=None, holds=None, fmt: RecordFormat | None = None,
                 owners: TopicFolds | None = None):
        self.client = client
        #: who made the outbox routes' topics (a record-too-large line names route and table)
        self.owners = owners
        #: how records are encoded (``[kafka] format``: ``formats.record_format``)
        self.fmt: RecordFormat = fmt if fmt is not None else JsonRecords()
        #: with ``[ha]``: ``Leadership.holds``, asked before every hand-over of records
        self.holds = holds
        self.inbox = inbox
        self.tickets = tickets  # to the confirm actor: Registered, Acked, Keepalive
        self.topic_specs = topic_specs  # route name -> settings template
        self.create_topics = create_topics
        self.stats = stats
        self.metrics = metrics  # actors.services.metrics.Metrics or None
        self._lock = threading.Lock()
        self._txns: dict[int, _Txn] = {}
        self._next_ticket = 0
        self._current: int | None = None  # ticket of the transactions being sent
        self._begin: Registered | None = None  # the current ticket's Registered while not yet sent
        self._in_txn = False  # a source transaction's last chunk has not arrived yet
        self._sent_records = 0  # records queued since the last stats update
        self._to_seal: list[int] = []  # closed tickets whose Registered is not sent yet
        self._completed: deque[int] = deque()
        self._outbox: list = []  # Registered/Keepalive/Hold not yet sent to the confirm actor
        self._wake = trio.Event()
        self._now = client.produce_now if isinstance(client, InlineProducer) else None
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken  # the trio run's (``run``)
        self._joinable = False  # the last records queued were whole transactions'
        self.schemas = Schemas(client=client, fmt=self.fmt, topic=schema_topic,
                               replication_factor=topic_specs.get(
                                   "", TopicSpec("")).replication_factor,
                               create_topic=create_topics, check_lease=self._check_lease)
        self._plain = self._plain_chunk if self.queues_plain_chunks else None
        #: records are queued as the router made them and converted in the producing thread
        #: (a format that registers, chunks queued as they come: ``_convert_produce``): the
        #: router's thread routes meanwhile, and a schema without an id stops the producing
        #: thread there until it is registered
        self._defer = self.fmt.registers and self.queues_plain_chunks

    # -- delivery callbacks (client thread) ---------------------------------------------------

    def _on_delivery(self, ticket: int, error, count: int) -> None:
        """The client's report for one ``produce`` call: ``count`` records acknowledged, or
        ``error`` (``router.delivery.tally``)."""
        if error is not None:
            self._token.run_sync_soon(self._fail, error)
            return
        with self._lock:
            txn = self._txns.get(ticket)
            if txn is None:  # abandoned: the input ended inside its transaction
                return
            txn.acked += count
            complete = txn.sealed and txn.acked == txn.sent
            if self.stats is not None:  # counted as batches arrive, not per transaction
                self.stats.acked_records += count
        if complete:
            self._token.run_sync_soon(self._complete, ticket)

    # -- trio side ----------------------------------------------------------------------------

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = self._described(error)
        self._wake.set()

    def _complete(self, ticket: int) -> None:
        self._completed.append(ticket)
        self._wake.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        task_status.started()
        with self.tickets:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._forward_completions)
                await self._consume()
                if self._in_txn:
                    self._abandon()
                # drained: every record handed over; wait until all are durable
                await trio.to_thread.run_sync(self.client.flush)
                while self._txns and self._error is None:
                    self._wake.set()
                    await trio.sleep(0.01)
                self._raise_if_failed()
                nursery.cancel_scope.cancel()
            await self._flush_completions()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            err = self._error
            raise (err if isinstance(err, SinkError) else self.client.map_error(err)) from err

    async def _forward_completions(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            self._raise_if_failed()
            await self._flush_completions()

    async def _flush_completions(self) -> None:
        if not self._completed:
            return
        done = []
        while self._completed:
            ticket = self._completed.popleft()
            with self._lock:
                txn = self._txns.pop(ticket)
            done.append(Acked(ticket, txn.acked))
        await self.tickets.send(done)

    async def _flush_tickets(self) -> None:
        """Send the registrations and keepalives gathered so far, as one list. Called before
        anything that can let a completion through, so an ``Acked`` never overtakes its
        ``Registered``."""
        if self._outbox:
            events, self._outbox = self._outbox, []
            self._begin = None
            await self.tickets.send(events)
            for ticket in self._to_seal:
                self._seal(ticket)
            self._to_seal.clear()
            if self._current is not None and not self._in_txn:
                self._seal(self._current)
                self._current = None

    def _seal(self, ticket: int) -> None:
        """No more records join ``ticket``: it is done once they are acknowledged. Called
        only after its ``Registered`` was sent, so ``Acked`` never overtakes it."""
        with self._lock:
            txn = self._txns[ticket]
            txn.sealed = True
            complete = txn.acked == txn.sent
        if complete:
            self._complete(ticket)

    async def _consume(self) -> None:
        with self.inbox:
            async for item in self.inbox:
                self._raise_if_failed()
                items = list(item)
                groups = 1
                while groups < MAX_GROUP:  # whatever else is waiting: one thread call
                    try:
                        items.extend(self.inbox.receive_nowait())
                        groups += 1
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                batch: list = []  # (records, ticket) not yet handed to the client
                plain = self._plain
                for item in items:
                    if type(item) is RoutedChunk:
                        if (plain is None or item.new_topics or item.schemas
                                or not plain(item, batch)):  # no await: no coroutine either
                            await self._chunk(item, batch)
                    elif type(item) in (Keepalive, Hold):
                        self._outbox.append(item)
                await self._produce(batch)
                await self._flush_tickets()
                await self._flush_completions()
                await self._group_done()

    def _abandon(self) -> None:
        """The input ended inside a source transaction produced in parts (a drain while it
        arrived): it is never reported done, so the slot is not confirmed past it and the
        next run sends it again (its records here are duplicates then)."""
        log.event(_log, "input ended inside a source transaction: its records are not "
                  "confirmed and are sent again by the next run", ticket=self._current)
        if self._current is not None:
            with self._lock:
                self._txns.pop(self._current, None)
        self._current, self._in_txn = None, False

    async def _group_done(self) -> None:
        """After each group: where the exactly-once sink commits (transactional_sink)."""

    async def _chunk(self, chunk: RoutedChunk, batch: list) -> None:
        """Registers the chunk's transaction and queues its records in ``batch``; topics and
        schemas it needs are made ready first (and what is queued before them handed over,
        so order is kept)."""
        whole = chunk.last and not self._in_txn
        self._register(chunk)
        await self._needs(chunk, batch)
        if self._defer:  # queued as they are (``_queue``), converted by ``_convert_produce``
            self.fmt.learn(chunk)
        elif self.fmt.registers and chunk.records:
            records = await self.schemas.encoded(chunk)
            self._queue(chunk, batch, whole, records)
            return
        self._queue(chunk, batch, whole)

    def _plain_chunk(self, chunk: RoutedChunk, batch: list) -> bool:
        """``_chunk`` for a chunk that needs no topic and no schema made ready first."""
        whole = chunk.last and not self._in_txn
        self._register(chunk)
        self._queue(chunk, batch, whole)
        return True

    def _register(self, chunk: RoutedChunk) -> None:
        if not self._in_txn:  # a transaction's first chunk
            if self._begin is not None and self._outbox[-1] is self._begin:
                # joins the current ticket, whose registration is not sent yet
                end = max(self._begin.end_lsn, chunk.end_lsn)
                self._begin = self._outbox[-1] = Registered(self._begin.ticket, end)
                self._txns[self._begin.ticket].end = end
            else:
                if self._current is not None:  # a keepalive or hold follows its Registered
                    self._to_seal.append(self._current)
                ticket = self._next_ticket
                self._next_ticket += 1
                with self._lock:
                    self._txns[ticket] = _Txn(chunk.end_lsn)
                self._current = ticket
                self._begin = Registered(ticket, chunk.end_lsn)
                self._outbox.append(self._begin)
            self._in_txn = True

    async def _needs(self, chunk: RoutedChunk, batch: list) -> None:
        """The topics and schemas ``chunk`` needs, made ready (what is queued before them
        handed over first, so order is kept)."""
        if chunk.new_topics and self.metrics is not None:
            for topic, route in chunk.new_topics:
                self.metrics.topic_route(topic, route)
        if chunk.new_topics and self.create_topics:
            await self._produce(batch)
            specs = []
            for topic, route in chunk.new_topics:
                tmpl = self.topic_specs.get(route) or TopicSpec(topic)
                specs.append(TopicSpec(topic, tmpl.partitions, tmpl.replication_factor,
                                       tmpl.configs))
            await trio.to_thread.run_sync(self.client.ensure_topics, specs)
        if chunk.schemas:
            await self._produce(batch)
            await self.schemas.publish(chunk.schemas)

    def _queue(self, chunk: RoutedChunk, batch: list, whole: bool,
               records: list | None = None) -> None:
        """The chunk's records into ``batch``. Consecutive transactions of one chunk each
        (``whole``) that share a ticket go to the client in one hand-over; the chunks of a
        larger transaction each in their own, so its acknowledged records are counted as
        they come."""
        ticket = self._current
        assert ticket is not None  # _register gave the chunk's transaction one
        if chunk.records:
            if records is None:
                records = chunk.records if self._defer else self.fmt(chunk)
            with self._lock:
                self._txns[ticket].sent += len(records)
            self._sent_records += len(records)
            if type(records) is not list:  # packed (an initial snapshot's): its own
                batch.append((records, ticket))
                whole = False
            elif whole and self._joinable and batch and batch[-1][1] == ticket:
                batch[-1][0].extend(records)
            else:  # a whole transaction's list is its own: the next ones join it
                batch.append((list(records) if whole else records, ticket))
            self._joinable = whole  # says what batch[-1] holds
        if chunk.last:
            self._in_txn = False
            if chunk.end_lsn > self._txns[ticket].end:
                self._end_known(ticket, chunk.end_lsn)
            elif self._begin is None:  # registered mid-transaction: sealed now
                self._seal(ticket)
                self._current = None

    def _end_known(self, ticket: int, end: int) -> None:
        """A transaction produced in parts was registered before its end LSN was known:
        registered again with it (the confirm actor moves the entry's position) before the
        ticket is sealed, or, while its registration is not sent yet, that one carries it."""
        self._txns[ticket].end = end
        begin, outbox = self._begin, self._outbox
        if begin is None:
            outbox.append(Registered(ticket, end))
            self._to_seal.append(ticket)  # sealed once that is sent
            self._current = None
            return
        for i in range(len(outbox) - 1, -1, -1):
            if outbox[i] is begin:
                self._begin = outbox[i] = Registered(ticket, end)
                return
