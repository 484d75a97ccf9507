"""The pipeline of ``pgrouter run`` as a value: ``build`` makes its actors, channels, topic
settings and metric bindings (a ``Pipeline``), on the start's ``Source``; the coordinator
runs it (``runner.coordinator``), the supervisor restarts it and reloads its routes.

Rules:

* Actors: slot reader → decoder → backfill → origin filter → router → Kafka sink →
  confirm actor → (confirmed LSN) → slot reader. The stages up to the router actor run in the
  slot reader's task (each one's ``out`` is the next one's ``handle``, ``mailbox.Inline``);
  the router actor, the sink and the confirm actor are joined by small bounded channels, so
  backpressure reaches the replication socket.
* Backfills (watermark windows) see the decoder's output before anything is dropped; the
  origin filter is left out when nothing can be dropped or the server drops it (PG >= 16).
* One ``PrimaryKeys`` is shared by the decoder and every router; every router made (one per
  set of route names) is listed in ``routers``, so a reload replaces the routes of each.
* Topic settings: each route's, the message routes', then the schema topic ("", one
  partition, the largest replication factor) and the definitions topic (compacted).
* Building starts nothing: no task, no connection. Metric bindings read the live ``Stats``
  and confirmed position.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import trio

from router.config.router import Config
from router.routing.following import DEFINITIONS_ROUTE
from router.pgoutput import Decoder
from router.routing.keys import PrimaryKeys
from router.stream.relations import RelationCache
from router.stream.origins import rules_from_config
from router.routing.change_router import ChangeRouter
from router.routing.transaction_meta import TransactionMeta
from router.stream.transactions import PART_CHANGES, TransactionAssembler
from router.routing.publications import Catalog
from router.routing.topics import TopicFolds, TopicSpec, own_topics

from ..snapshot.backfill import BackfillActor, backfill_stage
from ..snapshot.signals import message_topic_specs, router_extras, signal_handler
from ..services import publication_mode
from ..services.catalog import load_primary_keys
from ..services.metrics import Metrics
from ..services.sql import SqlSession
from ..pipeline.decoder import DecoderActor
from ..pipeline.delivery_watch import DeliveryWatch
from ..pipeline import definitions_state
from ..pipeline.router_actor import RouterActor, TypeNames
from ..pipeline.origin_filter import OriginFilterActor
from ..pipeline.mailbox import Inline, CHUNKS, ACKS, Latest
from ..pipeline.confirmer import ConfirmActor, Stats
from ..pipeline.transactional_sink import sink_for
from ..pipeline.slot_monitor import SlotMonitor
from ..pipeline.slot_reader import SlotReader, pgoutput_options
from .source import Source, route_specs


@dataclass
class Pipeline:
    """One run's actors and what the coordinator and the supervisor need of them to run,
    drain and reload."""
    slot: SlotReader
    backfill: BackfillActor | None
    origin_filter: OriginFilterActor | None
    sink: object
    confirm: ConfirmActor
    monitor: SlotMonitor
    watch: DeliveryWatch
    inbox: trio.MemorySendChannel  # the sink's inbox (the initial snapshot sends here too)
    tickets: trio.MemoryReceiveChannel  # the sink's tickets (``actors.runner.coordinator``)
    confirmed: Latest
    done: trio.Event  # caught up, every backfill done
    state: dict  # {"routes": the current route specs}
    routers: list  # (route names or None, ChangeRouter) of every router made


def build(cfg: Config, source: Source, client, *, confirmed: Latest, stats: Stats,
          metrics: Metrics | None, holds, definitions, catalog: Catalog | None,
          snapshot_pending: list, until_lsn: int | None,
          topics: frozenset = frozenset()) -> Pipeline:
    """The pipeline on ``source`` once ``Source.prepare`` found its slot; ``topics``: those
    Kafka held when it started (an outbox topic colliding with one is a dead row)."""
    src, info = cfg.source, source.server
    origins = rules_from_config(cfg)
    inbox, chunk_rx = trio.open_memory_channel(CHUNKS)  # the sink's
    tickets_tx, tickets = trio.open_memory_channel(ACKS)  # the sink's tickets
    caught_up = trio.Event()
    relations = RelationCache()
    keys = PrimaryKeys(info.primary_keys)  # shared by the decoder and every router
    slot = SlotReader(dsn=source.dsn, slot=source.slot, out=None, confirmed=confirmed,
                      status_interval=src.status_interval, stats=stats, holds=holds,
                      options=_options(cfg, info, origins, definitions is not None))
    decoder = DecoderActor(
        decoder=Decoder(info.proto_version),
        assembler=TransactionAssembler(relations, memory_limit=src.memory_limit,
                                       spill_dir=src.spill_dir, part_changes=_parts(cfg)),
        out=None, metrics=metrics, keys=keys,
        lookup=functools.partial(_primary_keys, source.dsn))
    # backfills (watermark windows) see the decoder's output before anything is dropped
    backfill, done = backfill_stage(
        cfg, slot=source.slot, db=info.db, client=client, confirmed=confirmed,
        pending=snapshot_pending, caught_up=caught_up)
    # origin filter between decoder and router actor, unless nothing can be dropped or the
    # server drops it (PG >= 16, "none" everywhere)
    origin_filter = None
    if not origins.passes_everything and origins.server_option(info.version) is None:
        origin_filter = OriginFilterActor(rules=origins, inbox=None, out=None)
    state = {"routes": definitions.routes if definitions is not None
             else route_specs(cfg, catalog)}
    routers: list[tuple[frozenset | None, ChangeRouter]] = []
    # shared: one router's topic is every router's
    folds = TopicFolds(topics, own_topics(cfg, state["routes"]))

    def router_for(names=None):
        router = ChangeRouter([r for r in state["routes"] if names is None or r.name in names],
                              db=info.db, messages_topic=cfg.kafka.messages_topic,
                              **router_extras(cfg, backfill),
                              type_names=TypeNames(relations),
                              primary_keys=keys,
                              position_headers=cfg.kafka.position_headers,
                              topic_folds=folds)
        if definitions is not None:
            router.follow(definitions, names)
        routers.append((names, router))
        return router
    router_actor = RouterActor(router=router_for(), inbox=None, out=inbox,
                         router_for=router_for,
                         meta=(TransactionMeta(cfg.kafka.transactions_topic, db=info.db,
                                              ignore=frozenset({cfg.kafka.definitions_topic}))
                               if cfg.kafka.transactions_topic else None),
                         metrics=metrics, signals=signal_handler(backfill))
    # slot reader → decoder → backfill → origin filter → router actor in the slot reader's
    # task: each one's ``out`` is the next one's ``handle`` (one task wake-up per WAL
    # batch, not five)
    stages = [s for s in (decoder, backfill, origin_filter, router_actor) if s is not None]
    for up, down in zip([slot, *stages], stages):
        up.out = Inline(down)
    sink = sink_for(cfg, client=client, inbox=chunk_rx, tickets=tickets_tx,
                    schema_topic=cfg.kafka.schema_topic, topic_specs=topic_specs(cfg),
                    create_topics=cfg.kafka.create_topics, stats=stats,
                    metrics=metrics, holds=holds, owners=folds)
    confirm = ConfirmActor(inbox=tickets, confirmed=confirmed, confirmed_lsn=info.confirmed_lsn,
                           stats=stats, interval=cfg.log.progress_interval,
                           until_lsn=until_lsn, caught_up=caught_up)
    if metrics is not None:
        _bind(metrics, stats, confirmed)
    monitor = SlotMonitor(dsn=source.dsn, slot=source.slot, interval=cfg.metrics.sample_interval,
                          metrics=metrics, warn_bytes=cfg.metrics.lag_warning_bytes,
                          warn_seconds=cfg.metrics.lag_warning_seconds,
                          lag_seconds=metrics.clock.lag_seconds if metrics else None)
    return Pipeline(slot=slot, backfill=backfill, origin_filter=origin_filter, sink=sink,
                    confirm=confirm, monitor=monitor, watch=DeliveryWatch(stats),
                    inbox=inbox, tickets=tickets, confirmed=confirmed, done=done, state=state,
                    routers=routers)


def _parts(cfg: Config) -> int | None:
    """Changes after which a transaction sent at its commit is produced in parts while it
    arrives; None (whole) when a transaction record counts the whole transaction."""
    return None if cfg.kafka.transactions_topic else PART_CHANGES


def topic_specs(cfg: Config) -> dict[str, TopicSpec]:
    """Topic settings by route name: the routes', the message routes', the schema topic's
    ("") and the definitions topic's."""
    specs = {r.name: TopicSpec(r.name, r.topic_settings.partitions,
                               r.topic_settings.replication_factor,
                               r.topic_settings.configs) for r in cfg.routes}
    specs.update(message_topic_specs(cfg))
    specs[""] = TopicSpec("", 1, max((s.replication_factor for s in specs.values()),
                                     default=1))
    specs[DEFINITIONS_ROUTE] = TopicSpec("", 1, specs[""].replication_factor,
                                         definitions_state.TOPIC_CONFIGS)
    return specs


def _options(cfg: Config, info, origins, follows_definitions: bool) -> dict[str, str]:
    """START_REPLICATION's pgoutput options for this start (``info``: ``Source.server``)."""
    src = cfg.source
    return pgoutput_options(proto_version=info.proto_version, publications=src.publications,
                            streaming=src.streaming,
                            # definitions and TRUNCATE markers
                            messages=(src.messages or follows_definitions
                                      or publication_mode.follows_publications(cfg)),
                            binary=src.binary, two_phase=src.two_phase,
                            origin=origins.server_option(info.version))


def _bind(metrics: Metrics, stats: Stats, confirmed: Latest) -> None:
    """The gauges read from this run's ``Stats`` and confirmed position; the lag clock anew."""
    metrics.clock.reset()
    metrics.bind(in_flight=lambda: stats.sent_records - stats.acked_records,
                 confirmed_lsn=lambda: confirmed.value,
                 received_lsn=lambda: stats.received_lsn)


async def _primary_keys(dsn: str, tables: list[tuple[str, str]]) -> dict:
    """The decoder's lookup of the primary keys of relations it does not know a key for."""
    async with await SqlSession.connect(dsn) as sql:
        return await load_primary_keys(sql, tables)
