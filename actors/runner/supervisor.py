"""The supervisor of ``pgrouter run``: starts the pipeline (built by ``runner.wiring``),
restarts it on transient failures, drains it on a signal, reloads its routes, and with
``[ha]`` runs it only while this process leads.

Start-up (``_run_once``, again after each restart):

1. failover check of the resume position; what ``pgrouter check`` finds wrong stops the
   router before a slot or a topic is made (``actors.services.preflight``);
2. without ``[ha]`` the slot is waited for while another router streams it or copies its
   initial snapshot (exactly-once: the slot's gate held first), with ``[ha]`` only a
   leader goes on; the Kafka client is made;
3. the ``Source`` (``runner.source``: the DSN, the slot, its queries and creation)
   finds or creates the slot (pgoutput, not in use — a killed predecessor's walsender is
   waited for briefly); it is dropped again if the run fails before streaming from it
   (``slot_owner.guarded``); one created for an initial snapshot exports it
   (``actors.snapshot.initial``) and is kept: an interrupted snapshot ends by backfill;
4. publication mode, catalog, the "starting" line (``--until-caught-up`` may stop here);
5. ``wiring.build`` makes the pipeline on that ``Source``; ``coordinator.run`` runs it: the
   initial snapshot first, into its sink (returning its ``SnapshotResult``), and the slot
   reader once Kafka holds it.

Steps 1-4 ask PostgreSQL on one session, closed before the pipeline runs. A start that will
copy an initial snapshot begins before its checks (``InitialSnapshot.begin``): the snapshot
state topic is read while they run, and the snapshot is planned from the checks' catalog.

Rules:

* A failure is retried when ``router.errors.is_retryable`` says so, with capped exponential
  backoff; the pipeline restarts from the slot's confirmed position (PostgreSQL resends
  everything not confirmed; records already in Kafka are sent again, identical, at the same
  position). Anything else stops the router with its message.
* Before a restart the old producer is closed (bounded, shielded wait) so records it still
  holds cannot land after the new pipeline's records of the same key.
* SIGTERM/SIGINT drain: stop reading, let every channel empty, flush Kafka, send the final
  confirmed LSN, exit 0. A second signal aborts (``Aborted``: one line, exit 1).
* SIGHUP (or the publication poller) reads the publications again; every router of the
  running pipeline takes the new routes from its next transaction on, a failed reload keeps
  the current ones.
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

from router.config.router import Config
from router.errors import LeadershipLost, PgRouterError
from router.postgres.lsn import format_lsn, parse_lsn
from router.routing.publications import Catalog

from ..services import failover, log, preflight as checks, publication_mode
from ..snapshot.initial import InitialSnapshot, interrupted as snapshot_interrupted
from ..services.catalog import load_catalog, needs_catalog, route_problems
from ..pipeline import definitions_state
from ..pipeline.mailbox import Latest
from ..console.board import Rates
from ..services.http import Endpoint, Health
from ..ha.leadership import Leadership
from ..services.metrics import Metrics, activate
from ..services.sql import SqlSession
from ..pipeline.confirmer import Stats
from ..services.retry import only_cancelled, primary, run_with_retries
from ..pipeline.transactional_sink import client_for
from ..pipeline.slot_owner import SlotOwner, guarded
from . import coordinator, wiring
from .source import SlotGate, Source, route_specs, wal_end_reader
from .status import describe_routes, open_endpoint

_log = log.get("supervisor")


class Supervisor:
    def __init__(self, cfg: Config, *, until_caught_up: bool = False, client_factory=None,
                 retry_timeout: float | None = None):
        self.cfg = cfg
        self.until_caught_up = until_caught_up
        self.retry_timeout = retry_timeout
        #: the source and its slot, read from the config once; its server facts anew at
        #: each start (``Source.prepare``)
        self.source = Source(cfg.source)
        self.slot_owner = SlotOwner(self.source.dsn, self.source.slot)
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
        self.leadership = (Leadership(cfg, self.source.slot, self.health) if cfg.ha.enabled
                           else None)
        self.endpoint: Endpoint | None = None
        self.snapshot_pending: list[str] = []  # an interrupted initial snapshot
        #: exactly-once without [ha]: held from before the transactional id is registered
        self.gate = (SlotGate(self.source.dsn, self.source.slot)
                     if cfg.kafka.exactly_once and self.leadership is None else None)
        #: "wal"/"poll"/None (``publication_mode.mode``); with "wal" the routers' definitions
        self.publication_mode: str | None = None
        self.definitions = None
        self._confirmed: Latest | None = None  # the last run's confirmed position (failover)
        #: for the console: each route's tables as PostgreSQL prints them, rates per route
        self.route_views: dict = {}
        self.rates = Rates()

    async def run(self) -> int:
        if self.metrics is not None:
            self.endpoint = open_endpoint(self)
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
        source, snapshot, client = self.source, None, None
        try:
            # one session for the start's queries: the checks, the snapshot's plan, the slot
            async with await SqlSession.connect(source.dsn) as sql:
                begun, client = await self._client(sql, source)
                if begun is not None:
                    snapshot = InitialSnapshot(self.cfg, client, source, begun)
                    await snapshot.create_slot(sql)
                    self.snapshot_pending = []
                else:
                    self.snapshot_pending = await snapshot_interrupted(self.cfg, client,
                                                                       source.slot)
                ready = await self._prepare(sql, source, snapshot)
            if ready:
                await self._pipeline(source, client, snapshot)
        finally:
            if snapshot is not None:  # its exported snapshot's connection, if still open
                await trio.to_thread.run_sync(snapshot.close)
            if client is not None:
                self._streaming(False, "not streaming (starting, restarting or stopped)")
                leading = self.leadership is None or self.leadership.holds()
                with trio.move_on_after(15) as scope:
                    scope.shield = True
                    await trio.to_thread.run_sync(client.close, 10.0 if leading else 0.0)

    async def _client(self, sql: SqlSession, source: Source):
        """The checks before anything is made, then the Kafka client (only a leader's, and
        with exactly-once and no [ha] only once the slot is free): when an initial snapshot
        is wanted, what it began before the checks (its state topic read while they run)
        and their catalog; and the client."""
        cfg = self.cfg
        await failover.check_resume(sql, source.slot, self._confirmed and self._confirmed.value)
        # a slot the router creates starts with a copy of the tables ([snapshot] mode)
        begun = await InitialSnapshot.begin(sql, cfg, source)
        # before the slot is made: what `pgrouter check` finds wrong stops the router here
        catalog = await checks.startup_checks(sql, cfg, source.slot,
                                              log_warnings=not self._warned)
        self._warned = True
        if begun is not None:
            begun.catalog = catalog
        # the stream its exactly-once progress belongs to
        stream = await source.identity(sql)
        waited = False
        if self.gate is not None:
            # registering the transactional id fences the router streaming the slot:
            # without [ha] to say who leads, a second router waits for the slot instead
            waited = await self.gate.hold()
        if self.leadership is None:
            # in both delivery modes a router streaming the slot or copying its initial
            # snapshot (the slot shows as free then) is waited for: one would otherwise
            # run alongside the copy, at-least-once finishing it by backfill
            waited = await source.wait_free(sql) or waited
        if begun is not None and waited:
            # what was begun may be stale after a wait: the router waited for may have made
            # the slot, or changed the publications; the slot looked for again, the state
            # topic read again and the publications checked again (the tables to copy are
            # read in the slot's exported snapshot: ``InitialSnapshot.create_slot``)
            begun = await InitialSnapshot.begin(sql, cfg, source)
        if self.leadership is not None and not self.leadership.holds():
            # with [ha] the producer registers the group's transactional id, which
            # fences whoever leads now: only a leader may make it
            raise LeadershipLost("leadership lost: no Kafka producer is made")
        client = await trio.to_thread.run_sync(
            functools.partial(self.client_factory, cfg, stream, wal_end_reader(sql)))
        return begun, client

    async def _prepare(self, sql: SqlSession, source: Source,
                       snapshot: InitialSnapshot | None) -> bool:
        """The slot found or created (``Source.prepare``), the publications and catalog
        read, the "starting" line; False when ``--until-caught-up`` has nothing to do."""
        cfg = self.cfg
        info = await source.prepare(sql, self._holds())
        self.slot_owner.created |= info.created_slot
        await source.refuse_invalidated(sql)
        self.publication_mode = await publication_mode.mode(sql, cfg, source.slot)
        if needs_catalog(cfg):  # with "wal" a route publication may be dropped by now
            self.catalog = await load_catalog(sql, cfg,
                                              strict=self.publication_mode != "wal")
        if self.metrics is not None:
            self.route_views = await describe_routes(sql, cfg)
        if self.until_caught_up and self.until_lsn is None:
            self.until_lsn = parse_lsn(await sql.fetchval(failover.WAL_END))
        source.log_starting(cfg, self.until_lsn)
        if (self.until_lsn is not None and info.confirmed_lsn >= self.until_lsn
                and not self.snapshot_pending and snapshot is None):
            log.event(_log, "caught up", confirmed_lsn=format_lsn(info.confirmed_lsn))
            return False
        return True

    async def _pipeline(self, source: Source, client,
                        snapshot: InitialSnapshot | None = None) -> None:
        cfg, confirmed_lsn = self.cfg, source.server.confirmed_lsn
        self.definitions = await definitions_state.for_pipeline(
            self.publication_mode, cfg, source.slot, client, confirmed_lsn)
        confirmed = self._confirmed = Latest(confirmed_lsn)
        # an outbox topic Kafka would refuse beside one it holds is a dead row, not a stop
        topics = (await trio.to_thread.run_sync(client.topic_names)
                  if any(r.outbox is not None for r in cfg.routes) else frozenset())
        p = wiring.build(cfg, source, client, confirmed=confirmed, stats=self.stats, topics=topics,
                         metrics=self.metrics, holds=self._holds(),
                         definitions=self.definitions, catalog=self.catalog,
                         snapshot_pending=self.snapshot_pending, until_lsn=self.until_lsn)
        async with trio.open_nursery() as reloader:
            if needs_catalog(cfg):  # lives as long as the pipeline, not longer
                reloader.start_soon(self._reload_on_hup, p.state, p.routers)
            if self.publication_mode == "poll":
                reloader.start_soon(definitions_state.PublicationPoller(
                    cfg, lambda: self._reload(p.state, p.routers), self.catalog).run)
            result = await coordinator.run(p, snapshot, self.drain, self._streamed)
            reloader.cancel_scope.cancel()
        if result is None or not result.stopped:
            self._until_reached(confirmed, p.confirm.held)

    def _streamed(self) -> None:
        """The slot reader started: the slot this run created is the consumers' now."""
        self.slot_owner.streamed = True
        self._streaming(True, "streaming")

    def _until_reached(self, confirmed: Latest, held) -> None:
        """``--until-caught-up``: the line saying where the run stopped."""
        if self.until_lsn is not None and confirmed.value >= self.until_lsn:
            log.event(_log, "caught up", confirmed_lsn=format_lsn(confirmed.value),
                      until_lsn=format_lsn(self.until_lsn))
        elif self.until_lsn is not None and held is not None:
            log.event(_log, "caught up except a prepared transaction: everything else is in "
                      "Kafka; it is delivered by a run after COMMIT PREPARED", level=WARNING,
                      gid=held.gid, prepare_lsn=format_lsn(held.prepare_lsn),
                      confirmed_lsn=format_lsn(confirmed.value),
                      until_lsn=format_lsn(self.until_lsn))

    def _holds(self):
        return None if self.leadership is None else self.leadership.holds

    def _streaming(self, on: bool, reason: str) -> None:
        self.health.set(on, reason)
        if self.metrics is not None:
            self.metrics.streaming.set(1 if on else 0)

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
