"""The supervisor: owns the nursery, wires the actors, restarts on transient failures.

Rules:

* Before streaming, what ``pgrouter check`` finds wrong stops the router before a slot or a
  topic is made (``actors.services.preflight``, every check once); then the slot is found or
  created (``runner.source``: pgoutput, not in use — a killed predecessor's walsender is
  waited for briefly) and dropped again if the run fails before streaming from it
  (``slot_owner.guarded``). A slot created for an initial snapshot is created with an
  exported snapshot (``actors.snapshot.initial``) and kept: an interrupted snapshot is
  finished by backfill.
* Actors: slot reader → decoder → backfill → origin filter → router → Kafka sink → confirm
  actor → (flush LSN) → slot reader, joined by small bounded channels, so backpressure
  reaches the replication socket. The initial snapshot is a source of the same sink: it runs
  first, and the slot reader starts once Kafka holds it.
* A failure is retried when ``router.errors.is_retryable`` says so, with capped exponential
  backoff; the pipeline restarts from the slot's confirmed position (PostgreSQL resends
  everything not confirmed; records already in Kafka are sent again, identical, at the same
  position). Anything else stops the router with its message.
* Before a restart the old producer is closed (bounded, shielded wait) so records it still
  holds cannot land after the new pipeline's records of the same key.
* SIGTERM/SIGINT drain: stop reading, let every channel empty, flush Kafka, send the final
  flush LSN, exit 0. A second signal aborts (``Aborted``: one line, exit 1).
* With ``[ha] enabled`` all of this runs only while this process leads its group
  (``actors.ha.leadership``); a router that lost leadership closes its producer without
  waiting for what it still queued, and the producer, transactional with ``[ha]``, is
  fenced by the next leader's (``actors.kafka.fencing``): what it sent after is refused.
"""

from __future__ import annotations

import functools
import signal
from logging import WARNING

import trio
import trio_asyncio

from router.config import Config, parse_listen
from router.following import DEFINITIONS_ROUTE
from router.errors import LeadershipLost, PgRouterError
from router import native
from router.lsn import format_lsn, parse_lsn
from router.pgoutput import Decoder
from router.keys import PrimaryKeys
from router.relations import RelationCache
from router.origins import rules_from_config
from router.routing import ChangeRouter
from router.transaction_meta import TransactionMeta
from router.transactions import TransactionAssembler
from router.publications import Catalog
from router.topics import TopicSpec

from ..services import log, preflight as checks
from ..snapshot.backfill import backfill_stage, finish_initial
from ..snapshot.signals import message_topic_specs, router_extras, signal_handler
from ..snapshot.initial import InitialSnapshot, interrupted as snapshot_interrupted
from ..services.catalog import load_catalog, load_primary_keys, needs_catalog, route_problems
from ..services import failover, publication_mode
from ..pipeline.decoder import DecoderActor
from ..pipeline import definitions_state
from ..pipeline.delivery_watch import DeliveryWatch
from ..pipeline.router_actor import RouterActor, TypeNames
from ..pipeline.origin_filter import OriginFilterActor
from ..pipeline.mailbox import Inline, CHUNKS, ACKS, Latest
from ..console.board import Rates
from ..console.web import Console
from ..services.http import Endpoint, Health
from ..ha.leadership import Leadership
from ..services.metrics import Metrics, activate
from ..services.sql import SqlSession
from ..pipeline.confirmer import ConfirmActor, Stats
from ..services.retry import only_cancelled, primary, run_with_retries
from ..pipeline.transactional_sink import client_for, sink_class
from ..pipeline.slot_monitor import SlotMonitor, refuse_invalidated, sample_slot
from ..pipeline.slot_owner import SlotOwner, guarded
from ..pipeline.slot_reader import SlotReader, pgoutput_options
from .source import (ServerInfo, SlotGate, identity, prepare_source, route_specs,
                     wait_slot_free,
                     wal_end_reader)
from .status import backfill_action, describe_routes, run_status

_log = log.get("supervisor")


class Supervisor:
    def __init__(self, cfg: Config, *, until_caught_up: bool = False, client_factory=None,
                 retry_timeout: float | None = None):
        self.cfg = cfg
        self.until_caught_up = until_caught_up
        self.retry_timeout = retry_timeout
        self.slot_owner = SlotOwner(cfg.source.dsn, cfg.source.slot)
        self.aborted = False
        self._warned = False  # the preflight's warnings are logged once
        self.client_factory = client_factory or client_for
        self.drain = trio.Event()
        self.stats = Stats()
        self.until_lsn: int | None = None
        self.restarts = 0
        self.catalog: Catalog | None = None
        #: Prometheus metrics and /readyz, with ``[metrics] listen`` set
        self.metrics = Metrics() if cfg.metrics.listen else None
        activate(self.metrics)
        self.health = Health()
        self.leadership = Leadership(cfg, self.health) if cfg.ha.enabled else None
        self.endpoint: Endpoint | None = None
        self.snapshot_pending: list[str] = []  # an interrupted initial snapshot
        #: exactly-once without [ha]: held from before the transactional id is registered
        self.gate = (SlotGate(cfg.source.dsn, cfg.source.slot)
                     if cfg.kafka.exactly_once and self.leadership is None else None)
        #: "wal"/"poll"/None (``publication_mode.mode``); with "wal" the routers' definitions
        self.publication_mode: str | None = None
        self.definitions = None
        self._flush: Latest | None = None  # the last run's confirmed position (failover)
        #: for the console: each route's tables as PostgreSQL prints them, rates per route
        self.route_views: dict = {}
        self.rates = Rates()

    async def run(self) -> int:
        if self.metrics is not None:
            host, port = parse_listen(self.cfg.metrics.listen)
            console = Console(self.cfg.console, lambda: run_status(self),
                              backfill_action(self.cfg))
            self.endpoint = Endpoint(host, port, self.metrics.registry, self.health,
                                     console=console, cfg=self.cfg.console)
            listening(self.endpoint, self.cfg.console)
        try:
            return await self._run()
        finally:
            if self.endpoint is not None:
                self.endpoint.close()

    async def _run(self) -> int:
        try:
            async with trio_asyncio.open_loop():
                body = self._run_with_retries
                if self.leadership is not None:
                    body = functools.partial(self.leadership.serve, body, self.drain)
                await guarded(body, self._signals, self.slot_owner, lambda: self.aborted)
        except BaseExceptionGroup as group:
            if only_cancelled(group):
                raise
            raise primary(group) from None
        return 0

    async def _signals(self, scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if not self.drain.is_set():
                    log.event(_log, "draining", signal=signal.Signals(signum).name)
                    self.drain.set()
                else:
                    log.event(_log, "aborting", signal=signal.Signals(signum).name)
                    self.aborted = True
                    scope.cancel()
                    return

    async def _run_with_retries(self) -> None:
        on_restart = (None if self.metrics is None
                      else lambda kind: self.metrics.restarts.labels(kind).inc())
        try:
            self.restarts = await run_with_retries(self._run_once, stop=self.drain,
                                                   logger=_log, on_restart=on_restart,
                                                   give_up_after=self.retry_timeout)
        finally:
            if self.gate is not None:
                await self.gate.release()

    async def _run_once(self) -> None:
        cfg = self.cfg
        src = cfg.source
        async with await SqlSession.connect(src.dsn) as sql:
            await failover.check_resume(sql, src, self._flush and self._flush.value)
            # before the slot is made: what `pgrouter check` finds wrong stops the router here
            await checks.startup_checks(sql, cfg, log_warnings=not self._warned)
            self._warned = True
            # a slot the router creates starts with a copy of the tables ([snapshot] mode)
            snapshot_wanted = await InitialSnapshot.wanted(sql, cfg)
            # the stream its exactly-once progress belongs to
            stream = await identity(sql, src.slot)
            if self.gate is not None:
                # registering the transactional id fences the router streaming the slot:
                # without [ha] to say who leads, a second router waits for the slot instead
                await self.gate.hold()
                await wait_slot_free(sql, src.slot)
            if self.leadership is not None and not self.leadership.holds():
                # with [ha] the producer registers the group's transactional id, which
                # fences whoever leads now: only a leader may make it
                raise LeadershipLost("leadership lost: no Kafka producer is made")
            client = await trio.to_thread.run_sync(
                functools.partial(self.client_factory, cfg, stream, wal_end_reader(sql)))
        snapshot = None
        try:
            if snapshot_wanted:
                snapshot = InitialSnapshot(cfg, client)
                await snapshot.create_slot()
                self.snapshot_pending = []
            else:
                self.snapshot_pending = await snapshot_interrupted(cfg, client)
            async with await SqlSession.connect(src.dsn) as sql:
                info = await prepare_source(sql, cfg, self._holds())
                self.slot_owner.created |= info.created_slot
                refuse_invalidated(src.slot, await sample_slot(sql, src.slot))
                self.publication_mode = await publication_mode.mode(sql, cfg)
                if needs_catalog(cfg):  # with "wal" a route publication may be dropped by now
                    self.catalog = await load_catalog(sql, cfg,
                                                      strict=self.publication_mode != "wal")
                if self.metrics is not None:
                    self.route_views = await describe_routes(sql, cfg)
                if self.until_caught_up and self.until_lsn is None:
                    self.until_lsn = parse_lsn(await sql.fetchval(failover.WAL_END))
            log.event(_log, "starting", dsn=src.dsn, slot=src.slot, db=info.db,
                      server_version=info.version, proto_version=info.proto_version,
                      origin_filter=rules_from_config(cfg).filtering_at(info.version),
                      confirmed_lsn=format_lsn(info.start_lsn),
                      until_lsn=(format_lsn(self.until_lsn) if self.until_lsn is not None
                                 else None),
                      hot_path=native.describe(), kafka_client=self.cfg.kafka.client)
            if (self.until_lsn is not None and info.start_lsn >= self.until_lsn
                    and not self.snapshot_pending and snapshot is None):
                log.event(_log, "caught up", confirmed_lsn=format_lsn(info.start_lsn))
                return
            self.definitions = await definitions_state.for_pipeline(
                self.publication_mode, cfg, client, info.start_lsn)
            await self._pipeline(info, client, snapshot)
        finally:
            if snapshot is not None:  # its exported snapshot's connection, if still open
                await trio.to_thread.run_sync(snapshot.close)
            self._streaming(False, "not streaming (starting, restarting or stopped)")
            leading = self.leadership is None or self.leadership.holds()
            with trio.move_on_after(15) as scope:
                scope.shield = True
                await trio.to_thread.run_sync(client.close, 10.0 if leading else 0.0)

    async def _pipeline(self, info: ServerInfo, client,
                        snapshot: InitialSnapshot | None = None) -> None:
        cfg, src = self.cfg, self.cfg.source
        origins = rules_from_config(cfg)
        chunk_tx, chunk_rx = trio.open_memory_channel(CHUNKS)
        prog_tx, prog_rx = trio.open_memory_channel(ACKS)
        flush = self._flush = Latest(info.start_lsn)
        caught_up = trio.Event()
        relations = RelationCache()
        keys = PrimaryKeys(info.primary_keys)  # shared by the decoder and every router
        slot = SlotReader(
            dsn=src.dsn, slot=src.slot, out=None, flush=flush,
            status_interval=src.status_interval, stats=self.stats, holds=self._holds(),
            options=pgoutput_options(proto_version=info.proto_version,
                                     publications=src.publications, streaming=src.streaming,
                                     # definitions and TRUNCATE markers
                                     messages=(src.messages or self.definitions is not None
                                               or publication_mode.follows_publications(cfg)),
                                     binary=src.binary,
                                     two_phase=src.two_phase,
                                     origin=origins.server_option(info.version)))
        decoder = DecoderActor(
            decoder=Decoder(info.proto_version),
            assembler=TransactionAssembler(relations, memory_limit=src.memory_limit,
                                           spill_dir=src.spill_dir),
            out=None, metrics=self.metrics, keys=keys,
            lookup=self._primary_keys)
        # backfills (watermark windows) see the decoder's output before anything is dropped
        backfill, done = backfill_stage(cfg, db=info.db, client=client, flush=flush,
                                        pending=self.snapshot_pending, caught_up=caught_up)
        # origin filter between decoder and router actor, unless nothing can be dropped or the
        # server drops it (PG >= 16, "none" everywhere)
        origin_filter = None
        if not origins.passes_everything and origins.server_option(info.version) is None:
            origin_filter = OriginFilterActor(rules=origins, inbox=None, out=None)
        state = {"routes": self.definitions.routes if self.definitions is not None
                 else route_specs(cfg, self.catalog)}
        routers: list[tuple[frozenset | None, ChangeRouter]] = []

        def router_for(names=None):
            router = ChangeRouter([r for r in state["routes"] if names is None or r.name in names],
                                  db=info.db, messages_topic=cfg.kafka.messages_topic,
                                  **router_extras(cfg, backfill),
                                  type_names=TypeNames(relations),
                                  primary_keys=keys,
                                  position_headers=cfg.kafka.position_headers)
            if self.definitions is not None:
                router.follow(self.definitions, names)
            routers.append((names, router))
            return router
        router_actor = RouterActor(router=router_for(), inbox=None, out=chunk_tx,
                             router_for=router_for,
                             meta=(TransactionMeta(cfg.kafka.transactions_topic, db=info.db,
                                                  ignore=frozenset({cfg.kafka.definitions_topic}))
                                   if cfg.kafka.transactions_topic else None),
                             metrics=self.metrics, signals=signal_handler(backfill))
        # slot reader → decoder → backfill → origin filter → router actor in the slot reader's
        # task: each one's ``out`` is the next one's ``handle`` (one task wake-up per WAL
        # batch, not five)
        stages = [s for s in (decoder, backfill, origin_filter, router_actor) if s is not None]
        for up, down in zip([slot, *stages], stages):
            up.out = Inline(down)
        specs = {r.name: TopicSpec(r.name, r.topic_settings.partitions,
                                   r.topic_settings.replication_factor,
                                   r.topic_settings.configs) for r in cfg.routes}
        specs.update(message_topic_specs(cfg))
        specs[""] = TopicSpec("", 1, max((s.replication_factor for s in specs.values()),
                                         default=1))
        specs[DEFINITIONS_ROUTE] = TopicSpec("", 1, specs[""].replication_factor,
                                             definitions_state.TOPIC_CONFIGS)
        sink = sink_class(cfg)(client=client, inbox=chunk_rx, progress=prog_tx,
                         schema_topic=cfg.kafka.schema_topic, topic_specs=specs,
                         create_topics=cfg.kafka.create_topics, stats=self.stats,
                         metrics=self.metrics, holds=self._holds())
        progress = ConfirmActor(inbox=prog_rx, flush=flush, start_lsn=info.start_lsn,
                                 stats=self.stats, interval=cfg.log.progress_interval,
                                 until_lsn=self.until_lsn, caught_up=caught_up)
        metrics = self.metrics
        if metrics is not None:
            stats = self.stats
            metrics.clock.reset()
            metrics.bind(in_flight=lambda: stats.sent_records - stats.acked_records,
                         confirmed_lsn=lambda: flush.value,
                         received_lsn=lambda: stats.received_lsn)
        monitor = SlotMonitor(dsn=src.dsn, slot=src.slot, interval=cfg.metrics.sample_interval,
                              metrics=metrics, warn_bytes=cfg.metrics.lag_warning_bytes,
                              warn_seconds=cfg.metrics.lag_warning_seconds,
                              lag_seconds=metrics.clock.lag_seconds if metrics else None)
        async with trio.open_nursery() as reloader:
            if needs_catalog(cfg):  # lives as long as the pipeline, not longer
                reloader.start_soon(self._reload_on_hup, state, routers)
            reloader.start_soon(monitor.run)
            if self.publication_mode == "poll":
                reloader.start_soon(definitions_state.PublicationPoller(
                    cfg, lambda: self._reload(state, routers), self.catalog).run)
            reloader.start_soon(DeliveryWatch(self.stats).run)
            stopped = False
            async with trio.open_nursery() as nursery:
                await nursery.start(sink.run)
                # the initial snapshot first, into the same sink; the stream starts once
                # Kafka holds it (the snapshot reads the sink's tickets until then), or not
                # at all when a drain stopped it (the sink then drains and returns)
                if snapshot is not None and not await snapshot.run(chunk_tx.clone(), prog_rx,
                                                                   self.drain):
                    stopped = True
                    chunk_tx.close()
                else:
                    if snapshot is not None and snapshot.left:  # rewritten while it ran
                        finish_initial(backfill, snapshot.left)
                    await nursery.start(progress.run)
                    if origin_filter is not None:
                        origin_filter.start()
                    if backfill is not None:
                        await nursery.start(backfill.run)
                    await nursery.start(slot.run)
                    self.slot_owner.streamed = True
                    nursery.start_soon(self._drain_when, slot, done)
                    self._streaming(True, "streaming")
            reloader.cancel_scope.cancel()
        if stopped:
            return
        if self.until_lsn is not None and flush.value >= self.until_lsn:
            log.event(_log, "caught up", confirmed_lsn=format_lsn(flush.value),
                      until_lsn=format_lsn(self.until_lsn))
        elif self.until_lsn is not None and progress.held is not None:
            held = progress.held
            log.event(_log, "caught up except a prepared transaction: everything else is in "
                      "Kafka; it is delivered by a run after COMMIT PREPARED", level=WARNING,
                      gid=held.gid, prepare_lsn=format_lsn(held.prepare_lsn),
                      confirmed_lsn=format_lsn(flush.value),
                      until_lsn=format_lsn(self.until_lsn))

    def _holds(self):
        return None if self.leadership is None else self.leadership.holds

    def _streaming(self, on: bool, reason: str) -> None:
        self.health.set(on, reason)
        if self.metrics is not None:
            self.metrics.streaming.set(1 if on else 0)

    async def _primary_keys(self, tables: list[tuple[str, str]]) -> dict:
        async with await SqlSession.connect(self.cfg.source.dsn) as sql:
            return await load_primary_keys(sql, tables)

    async def _reload_on_hup(self, state: dict, routers: list) -> None:
        """SIGHUP: read the publications again; every router uses the new definitions from
        its next transaction on. A failed reload keeps the current ones."""
        with trio.open_signal_receiver(signal.SIGHUP) as signals:
            async for _ in signals:
                if self.definitions is not None:
                    log.event(_log, "publication definitions follow the WAL: nothing to reload")
                    continue
                await self._reload(state, routers)

    async def _reload(self, state: dict, routers: list) -> None:
        """Read the publications again (SIGHUP, or a change the poller noticed)."""
        try:
            async with await SqlSession.connect(self.cfg.source.dsn) as sql:
                catalog = await load_catalog(sql, self.cfg)
                views = await describe_routes(sql, self.cfg) if self.metrics else {}
            specs = route_specs(self.cfg, catalog)
        except PgRouterError as exc:
            log.event(_log, "reload failed, keeping the current publications",
                      error=str(exc), kind=type(exc).__name__)
            return
        for path, problem in route_problems(self.cfg, catalog):
            log.event(_log, "route problem", path=path, problem=problem)
        self.catalog = catalog
        self.route_views = views
        state["routes"] = specs
        for names, router in routers:
            router.replace_routes([r for r in specs if names is None or r.name in names])
        log.event(_log, "publications reloaded", routes=len(specs))

    async def _drain_when(self, slot: SlotReader, caught_up: trio.Event) -> None:
        async with trio.open_nursery() as nursery:
            async def wait(ev):
                await ev.wait()
                nursery.cancel_scope.cancel()
            nursery.start_soon(wait, self.drain)
            nursery.start_soon(wait, caught_up)
        slot.stop_reading()


def listening(endpoint: Endpoint, console) -> None:
    """The endpoint's start line, and a warning when it answers beyond this machine without
    credentials (the console shows the configuration, secrets taken out)."""
    host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
    base = f"{endpoint.scheme}://{host}:{endpoint.port}"
    log.event(_log, "metrics endpoint listening", url=f"{base}/metrics",
              console=f"{base}/" if console.enabled else None)
    if (console.enabled and not (console.token or console.username)
            and endpoint.host not in ("127.0.0.1", "::1", "localhost")):
        log.event(_log, "the console answers anyone who reaches this address: set [console] "
                  "token or username/password", level=WARNING, listen=f"{host}:{endpoint.port}")
