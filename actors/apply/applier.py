"""The applier: the router's topics in, whole source transactions applied to another
PostgreSQL, each tagged with a replication origin (``pgrouter apply``).

Rules:

* Two actors joined by a small channel: the consumer (``actors.kafka.consumers``; what
  librdkafka has already fetched is taken without blocking, waiting happens in a worker
  thread: measured, hopping to the thread for every poll cost a third of the throughput)
  reads the transaction topic and the data topics its
  END records name, and releases complete transactions in source commit order
  (``router.apply.reassembly``); the writer (``actors.apply.writer``) applies each one in one
  target transaction while the consumer already reads the next records.
* Exactly-once: at start the origin's durable progress is read
  (``pg_replication_origin_progress(origin, true)``); transactions at or below it are
  skipped. Reading starts at the Kafka offsets stored in the progress table with the last
  applied transactions (``actors.apply.target``), so a restart reads only what is new;
  without them (a first start) at the beginning of the topics. Nothing depends on
  Kafka-side state (no consumer group, no committed offsets).
* Transient failures (Kafka or the target unavailable) restart both actors with backoff,
  from the target's progress. ``--until-caught-up`` ends once every transaction whose END
  was in the transaction topic at start is applied.
"""

from __future__ import annotations

import gc
import signal
import time

import trio
import trio_asyncio

from router.config.applier import ApplyConfig
from router.config.router import parse_listen
from router.errors import PgRouterError
from router.postgres.lsn import format_lsn
from router.apply.reassembly import Reassembler

from ..services import log
from ..console.web import Console
from ..services.http import Endpoint, Health
from ..services.retry import run_with_retries
from ..services.sql import SqlSession
from .status import apply_status
from .target import setup_session
from ..kafka.consumers import TopicReader, client_name, open_reader
from ..kafka.registry import decoder_for
from .inbox import CAUGHT_UP
from .writer import ApplyStats, WriterActor

_log = log.get("applier")
#: channel size, in lists of transactions (at most ``SLICE`` each), so the writer finds
#: many small transactions to send at once
RELEASES = 4
#: records the consumer decodes, or transactions it releases, before it lets the writer
#: run (about a millisecond of its time)
SLICE = 500


class ConsumerActor:
    def __init__(self, *, reader: TopicReader, reassembler: Reassembler,
                 out: trio.MemorySendChannel, until_caught_up: bool = False,
                 stop: trio.Event | None = None, resume: dict[str, int] | None = None,
                 decoder=None):
        self.reader = reader
        #: ``actors.kafka.registry.AvroDecoder`` for Avro data topics, or None
        self.decoder = decoder
        self.reassembler = reassembler
        self.out = out
        self.until_caught_up = until_caught_up
        self.stop = stop if stop is not None else trio.Event()
        self.resume = resume
        self.poll_s = 0.0  # seconds waiting for Kafka
        self.send_s = 0.0  # seconds waiting for the writer

    async def _from_avro(self, records: list) -> list:
        """Avro records as pgrouter's JSON envelope (a key change one update again, as the
        transaction topic counts it); schemas the decoder lacks fetched in a thread first."""
        decoder = self.decoder
        missing = decoder.unknown([v for _, v in records])
        if missing:
            await trio.to_thread.run_sync(decoder.fetch, missing)
        return [(o, decoder.to_json(v, updates=True)) for o, v in records]

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        reader, ra = self.reader, self.reassembler
        tx_topic = reader.transactions_topic
        task_status.started()
        with self.out:
            await trio.to_thread.run_sync(reader.start, self.resume)
            tx_position = (self.resume or {}).get(f"{tx_topic}/0", 0)
            end_at_start = None
            if self.until_caught_up:
                end_at_start = await trio.to_thread.run_sync(reader.transactions_end_offset)
                if end_at_start is None:
                    log.event(_log, "no transaction topic yet: nothing to apply")
                    await self.out.send([CAUGHT_UP])
                    return
            else:
                while not await trio.to_thread.run_sync(reader.wait_for_transactions_topic):
                    if self.stop.is_set():
                        return
            add_tx, add_records = ra.add_transaction_record, ra.add_records
            clock = time.perf_counter
            while not self.stop.is_set():
                # checked before each poll: a start with nothing new (the stored offsets
                # at the topic's end) ends without waiting for a poll's timeout
                if end_at_start is not None and tx_position >= end_at_start:
                    oldest = ra.oldest_pending_offset()
                    if oldest is None or oldest >= end_at_start:
                        await self.out.send([CAUGHT_UP])
                        return
                batch = reader.poll_ready()
                if batch:
                    await trio.lowlevel.checkpoint()  # let the writer run between batches
                else:
                    t0 = clock()
                    batch = await trio.to_thread.run_sync(reader.poll)
                    self.poll_s += clock() - t0
                new_topics: list[str] = []
                for topic, partition, records in batch:
                    # a poll's records in slices, the writer let run between them: it
                    # finds its target's answer at once, not after the whole poll
                    for start in range(0, len(records), SLICE):
                        part = records[start:start + SLICE]
                        if start:
                            await trio.lowlevel.checkpoint()
                        if topic == tx_topic:
                            for offset, value in part:
                                new_topics += add_tx(value, offset)
                        else:
                            if self.decoder is not None:
                                part = await self._from_avro(part)
                            add_records(topic, partition, part)
                    if topic == tx_topic:
                        tx_position = records[-1][0] + 1
                if new_topics:
                    await trio.to_thread.run_sync(reader.add_topics, new_topics)
                while released := list(ra.ready(SLICE)):
                    t0 = clock()
                    await self.out.send(released)
                    self.send_s += clock() - t0


class Applier:
    """Wires consumer and writer, restarts both on transient failures, drains on signals."""

    def __init__(self, cfg: ApplyConfig, *, until_caught_up: bool = False,
                 retry_timeout: float | None = None):
        self.cfg = cfg
        self.until_caught_up = until_caught_up
        self.retry_timeout = retry_timeout
        self.stats = ApplyStats()
        self.stop = trio.Event()
        self._reader: TopicReader | None = None
        self._reassembler: Reassembler | None = None
        self.health = Health()

    async def run(self) -> int:
        endpoint = None
        if self.cfg.metrics.listen:
            # prometheus_client (and the HTTP server modules under it) only with an endpoint
            from .metrics import registry_for

            host, port = parse_listen(self.cfg.metrics.listen)
            console = Console(self.cfg.console, lambda: apply_status(self))
            endpoint = Endpoint(host, port, registry_for(self), self.health, console=console,
                                cfg=self.cfg.console)
            log.event(_log, "metrics endpoint listening",
                      url=f"{endpoint.scheme}://{host}:{endpoint.port}/metrics")
        try:
            return await self._run()
        finally:
            if endpoint is not None:
                endpoint.close()

    async def _run(self) -> int:
        # what is loaded by now lives as long as the process: keep the collector off it
        gc.freeze()
        error: PgRouterError | None = None
        async with trio_asyncio.open_loop():
            async with trio.open_nursery() as nursery:
                async def signals():
                    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as sigs:
                        async for _ in sigs:
                            if self.stop.is_set():
                                nursery.cancel_scope.cancel()
                                return
                            log.event(_log, "draining")
                            self.stop.set()
                nursery.start_soon(signals)
                try:
                    await self._run_with_retries()
                except PgRouterError as exc:
                    error = exc  # raised below, outside the nursery's exception group
                finally:
                    nursery.cancel_scope.cancel()
        self._report("applier stopped")
        if error is not None:
            raise error
        return 0

    def _collect(self) -> None:
        """Fold the counters of the finished run's reader and reassembler into the stats
        (read, never reset, while they count: the reader counts in a worker thread)."""
        if self._reader is not None:
            self.stats.fetched += self._reader.fetched
        ra = self._reassembler
        if ra is not None:
            self.stats.skipped += ra.skipped
            self.stats.spills += ra.spills
            self.stats.buffered_peak = max(self.stats.buffered_peak, ra.peak_memory)
        self._reader = self._reassembler = None

    def _report(self, msg: str) -> None:
        s, reader, ra = self.stats, self._reader, self._reassembler
        log.event(_log, msg, transactions=s.transactions, changes=s.changes,
                  skipped=s.skipped + (ra.skipped if ra else 0),
                  fetched=s.fetched + (reader.fetched if reader else 0),
                  snapshot_rows=s.snapshot_rows, scripts=s.scripts, ahead=s.ahead,
                  slow=s.slow,
                  spills=s.spills + (ra.spills if ra else 0),
                  buffered_peak=max(s.buffered_peak, ra.peak_memory if ra else 0),
                  conflicts=sum(s.conflicts.values()),
                  **{f"conflicts_{k}": v for k, v in s.conflicts.items()})

    async def _run_with_retries(self) -> None:
        await run_with_retries(self._run_once, stop=self.stop, logger=_log,
                               give_up_after=self.retry_timeout)

    async def _run_once(self) -> None:
        cfg = self.cfg
        async with await SqlSession.connect(cfg.target.dsn, path="target.dsn") as sql:
            progress, resume = await setup_session(sql, cfg.target)
            log.event(_log, "applying", dsn=cfg.target.dsn, origin=cfg.target.origin,
                      origin_progress=format_lsn(progress),
                      transactions_topic=cfg.kafka.transactions_topic,
                      conflict=cfg.target.conflict, client=client_name(cfg.kafka),
                      resume="stored offsets" if resume else "beginning")
            reader = self._reader = await trio.to_thread.run_sync(open_reader, cfg.kafka)
            ra = self._reassembler = Reassembler(
                reader.wants, progress, transactions_topic=cfg.kafka.transactions_topic,
                memory_limit=cfg.target.memory_limit, spill_dir=cfg.target.spill_dir,
                positions=resume)
            try:
                tx, rx = trio.open_memory_channel(RELEASES)
                consumer = ConsumerActor(reader=reader, reassembler=ra, out=tx,
                                         until_caught_up=self.until_caught_up,
                                         stop=self.stop, resume=resume,
                                         decoder=decoder_for(cfg.kafka.registry))
                writer = WriterActor(sql=sql, cfg=cfg, inbox=rx, stats=self.stats,
                                     progress_lsn=progress)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._progress_lines)
                    await nursery.start(consumer.run)
                    self.health.set(True, "applying")
                    try:
                        # returns at CAUGHT_UP, or when the consumer stops (drain)
                        await writer.run()
                    finally:
                        self.health.set(False, "not applying (starting, restarting or "
                                               "stopped)")
                    nursery.cancel_scope.cancel()
                # where the time went: waiting for Kafka, for the writer, for the target,
                # for released transactions
                log.event(_log, "waited", poll_s=round(consumer.poll_s, 3),
                          send_s=round(consumer.send_s, 3), sql_s=round(writer.sql_s, 3),
                          receive_s=round(writer.receive_s, 3))
            finally:
                ra.close()
                self._collect()
                with trio.move_on_after(10) as scope:
                    scope.shield = True
                    await trio.to_thread.run_sync(reader.close)
        if writer.caught_up:
            log.event(_log, "caught up", origin_progress=format_lsn(writer.progress_lsn))

    async def _progress_lines(self) -> None:
        while True:
            await trio.sleep(self.cfg.log.progress_interval)
            self._report("progress")
