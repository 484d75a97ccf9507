"""The router's configuration file (TOML), decoded and validated with msgspec.

Rules: unknown keys and wrong types are rejected with the key's path (``routes[1].topic``);
every value is checked once here, so the actors never meet a half-valid config. Secrets
(DSN passwords, SASL passwords) are masked whenever the config is shown or logged.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Annotated, Literal

import msgspec

from ..postgres import dsn as dsns
from .files import decode_toml, read_config_text
from .console import ConsoleConfig, validate_console
from ..errors import ConfigError
from ..delivery.exactly_once import validate_exactly_once
from ..delivery.ha import HaConfig, validate_ha
from ..postgres.identifiers import split_qualified
from ..formats.record_format import record_format
from .kafka_settings import parse_bootstrap_servers, translate as translate_kafka_settings
from ..stream.origins import OriginSetting, parse_policy
from ..routing.topics import illegal, template_problem
from ..routing.outbox import OutboxConfig, validate_outbox
from ..formats.tombstones import validate_compacted
from ..routing.message_routes import MessageRouteConfig, claim_route_name, validate_message_routes
from ..routing.transforms import TransformConfig, validate_transforms

Operation = Literal["insert", "update", "delete", "truncate"]
ALL_OPERATIONS: tuple[Operation, ...] = ("insert", "update", "delete", "truncate")
_TOPIC_FIELDS = {"route", "schema", "table"}
_TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._\-]+$")
#: what PostgreSQL accepts as a replication slot name (ReplicationSlotValidateName)
SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")

#: numbers that only make sense above zero (or from zero); msgspec names the key when not
Positive = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]


class _Base(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class SourceConfig(_Base):
    dsn: str
    slot: str
    publications: list[str]
    create_slot: bool = False
    #: pgoutput protocol version; 0 = the highest the server supports (4 on PG16+, 3 on 15)
    proto_version: Annotated[int, msgspec.Meta(ge=0, le=4)] = 0
    #: stream large in-progress transactions (proto ≥ 2); the router buffers them until commit
    streaming: bool = True
    #: decode prepared transactions at PREPARE (proto ≥ 3); records are released at COMMIT
    #: PREPARED. Off: PostgreSQL sends them as ordinary transactions at COMMIT PREPARED.
    two_phase: bool = False
    messages: bool = True
    #: pgoutput's binary mode; refused (``validate``): records carry PostgreSQL's text form
    binary: bool = False
    #: create the slot with ``failover = true`` (PostgreSQL 17+) so a standby with
    #: ``sync_replication_slots`` keeps a copy that survives its promotion
    failover: bool = False
    #: seconds between standby status updates
    status_interval: Positive = 2.0
    #: bytes of buffered streamed-transaction changes kept in memory before spilling to disk
    memory_limit: PositiveInt = 64 * 1024 * 1024
    spill_dir: str | None = None
    #: how routes that follow a publication see its changes: "wal" (the definitions messages
    #: of ``pgrouter setup``'s event trigger, at their WAL position), "poll" (pg_publication*
    #: polled every ``publication_poll_interval`` seconds; positions approximate), "auto"
    #: (wal when the trigger is installed)
    publication_changes: Literal["auto", "wal", "poll"] = "auto"
    publication_poll_interval: Positive = 5.0


class TopicSettings(_Base):
    partitions: PositiveInt = 1
    replication_factor: PositiveInt = 1
    configs: dict[str, str] = {}


class RegistryConfig(_Base):
    """``[kafka.registry]``: the schema registry of ``format = "avro"`` (its Confluent-
    compatible API: Confluent Schema Registry, Apicurio's ``/apis/ccompat/v7``, Karapace,
    Redpanda)."""

    #: base URL of the Confluent-compatible API
    url: str
    #: HTTP basic auth (``password`` is masked wherever the config is shown)
    username: str = ""
    password: str = ""
    #: TLS: CA bundle to trust, and a client certificate and key for mutual TLS
    ssl_ca_location: str = ""
    ssl_certificate_location: str = ""
    ssl_key_location: str = ""
    #: subject of a topic's schemas: "topic" (``<topic>-key``/``-value``, the default),
    #: "record" (the record's full name) or "topic_record" (``<topic>-<full name>``)
    subject_naming: Literal["topic", "record", "topic_record"] = "topic"
    #: compatibility level set on each subject that has none of its own, before the first
    #: registration there ("" = leave the registry's default; an operator's level is kept)
    compatibility: Literal["", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD",
                           "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE"] = ""
    #: register new schemas (false: they must exist already; the router stops otherwise)
    auto_register: bool = True
    #: seconds one HTTP request may take
    timeout: Positive = 10.0


class KafkaConfig(_Base):
    bootstrap_servers: str | list[str]
    #: "auto" (the default) is resolved when the config is parsed: librdkafka when
    #: confluent-kafka is importable, else kafka-python (``resolve_client``)
    client: Literal["auto", "kafka-python", "librdkafka"] = "auto"
    #: compacted topic holding the table schemas records refer to (``source.schema_id``)
    schema_topic: str = "pgrouter.schemas"
    #: topic for logical decoding messages (``pg_logical_emit_message``); empty = dropped
    messages_topic: str = ""
    #: topic keeping the publication definitions in force, per slot, with the router's
    #: progress (``router.routing.definitions``); read at start
    definitions_topic: str = "pgrouter.publications"
    create_topics: bool = True
    #: Kafka headers ``pgrouter.commit_lsn`` and ``pgrouter.seq`` on every change record (the
    #: position the value's ``source`` carries anyway; they cost the client ~1 µs a record)
    position_headers: bool = False
    #: topic with a BEGIN and an END record per source transaction (Debezium's transaction
    #: metadata; END counts the records written to each topic); empty = not written
    transactions_topic: str = ""
    #: client settings in one vocabulary for both clients (compression_type, linger_ms,
    #: security_protocol, sasl_*, ssl_* …, see router.config.kafka_settings); unknown keys are
    #: refused; acks and idempotence are pgrouter's and cannot be overridden
    settings: dict[str, str | int | float | bool] = {}
    #: Kafka transactions: each change exactly once for read_committed consumers
    #: (router.delivery.exactly_once); the committed-LSN topic holds the last committed end LSN
    exactly_once: bool = False
    #: the producer's transactional id ("" = "pgrouter-<slot>-<db>-<system id>"); one
    #: router per id
    transactional_id: str = ""
    #: compacted topic of the last source transaction each transactional id committed
    #: (its end LSN and stream); formerly ``progress_topic``
    committed_lsn_topic: str = "pgrouter.progress"
    #: a Kafka transaction is committed at a source transaction's end once this much time
    #: has passed since it began, or when nothing more is waiting
    transaction_interval_ms: int = 100
    #: record format: "json" (Debezium-shaped JSON), "connect" (Kafka Connect JSON with
    #: schema + payload, as Debezium's JsonConverter writes it; router.formats.connect) or
    #: "avro" (Avro in the Confluent wire format with a schema registry; router.formats.avro)
    format: Literal["json", "connect", "avro"] = "json"
    #: the schema registry (needed by format = "avro")
    registry: RegistryConfig | None = None


class RouteConfig(_Base):
    name: str
    tables: list[str] = []
    schemas: list[str] = []
    all_tables: bool = False
    operations: list[Operation] = msgspec.field(default_factory=lambda: list(ALL_OPERATIONS))
    topic: str = "{route}.{schema}.{table}"
    topic_settings: TopicSettings = msgspec.field(default_factory=TopicSettings)
    #: replaces the router-wide [origin] policy for this route (see router.stream.origins)
    origin: OriginSetting | None = None
    #: take tables, actions, row filters and column lists from a catalog publication (or
    #: several, combined as one subscription would) instead of tables/schemas/all_tables
    publication: str = ""
    publications: list[str] = []
    #: with ``tables``: a row filter (publication WHERE syntax) and a column list of our own
    where: str = ""
    columns: list[str] = []
    #: a null-value record after each delete, so a compacted topic forgets the key
    #: (``router.formats.tombstones``; off by default: existing topics do not change)
    tombstones: bool = False
    #: column transforms for personal data (``router.routing.transforms``)
    transforms: list[TransformConfig] = []
    #: transforms may change key columns (and so the record key and partition)
    transform_keys: bool = False
    #: the route's tables are outboxes: each insert is an event (``router.routing.outbox``)
    outbox: OutboxConfig | None = None

    def publication_names(self) -> list[str]:
        return [self.publication] if self.publication else list(self.publications)


class LogConfig(_Base):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"
    #: seconds between progress lines
    progress_interval: Positive = 10.0


class MetricsConfig(_Base):
    #: ``host:port`` of the HTTP endpoint serving ``/metrics``, ``/healthz`` and ``/readyz``
    #: (``""``: no endpoint). Port 0 picks a free port (logged at start).
    listen: str = ""
    #: seconds between samples of the slot over SQL (lag, retained WAL, ``wal_status``)
    sample_interval: float = 15.0
    #: a warning line (and ``pgrouter_slot_lag_warning`` = 1) when the slot's lag exceeds
    #: this many bytes / seconds; 0 = never
    lag_warning_bytes: int = 0
    lag_warning_seconds: float = 0.0


class SnapshotConfig(_Base):
    """``[snapshot]``: what a new slot's topics start with, and how backfills run
    (``actors.snapshot``; README "Snapshots")."""

    #: "initial": when the router creates the slot it first copies every routed table
    #: (op "r" records) and then streams from the slot's consistent point, as a PostgreSQL
    #: subscription (copy_data = true) and Debezium (snapshot.mode = initial) do; "never":
    #: topics hold only changes made after the slot was created
    mode: Literal["initial", "never"] = "initial"
    #: tables read at the same time (one PostgreSQL session each)
    parallel: PositiveInt = 4
    #: rows per backfill chunk (read between two watermarks, held in memory until the high one)
    chunk_rows: PositiveInt = 2048
    #: compacted topic holding the state of snapshots and backfills (route, table, last key
    #: done); formerly ``progress_topic``
    state_topic: str = "pgrouter.snapshots"


class Config(_Base):
    source: SourceConfig
    kafka: KafkaConfig
    routes: list[RouteConfig]
    #: logical decoding messages published by prefix (``router.routing.message_routes``)
    message_routes: list[MessageRouteConfig] = []
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)
    snapshot: SnapshotConfig = msgspec.field(default_factory=SnapshotConfig)
    console: ConsoleConfig = msgspec.field(default_factory=ConsoleConfig)
    #: which transactions to publish by replication origin (router.stream.origins); default "any"
    origin: OriginSetting | None = None
    #: standby routers coordinated by Kafka's group coordinator (router.delivery.ha)
    ha: HaConfig = msgspec.field(default_factory=HaConfig)


def resolve_client(client: str, rdkafka_installed: bool) -> str:
    """The Kafka client ``[kafka] client`` stands for: ``"auto"`` is librdkafka when
    confluent-kafka is installed (about ten times less CPU per record), else kafka-python."""
    if client != "auto":
        return client
    return "librdkafka" if rdkafka_installed else "kafka-python"


def rdkafka_installed() -> bool:
    return importlib.util.find_spec("confluent_kafka") is not None


def parse_config(text: str, *, source: str = "<config>",
                 notes: list[str] | None = None) -> Config:
    """``text`` as a Config; the warnings it earns (old key names) are appended to
    ``notes``."""
    cfg = decode_toml(text, Config, source=source, rename=[] if notes is None else notes)
    if cfg.kafka.client == "auto":
        cfg.kafka.client = resolve_client("auto", rdkafka_installed())
    validate(cfg, source=source)
    return cfg


def load_config(path: str, notes: list[str] | None = None) -> Config:
    return parse_config(read_config_text(path), source=path, notes=notes)


def _qualified(name: str, *, path: str, source: str) -> tuple[str, str]:
    try:
        return split_qualified(name)
    except ValueError as exc:
        raise ConfigError(str(exc), path=path, source=source) from None


#: why ``[source] binary = true`` is refused (by ``check`` and ``run``, at load)
BINARY_REFUSED = (
    "binary = true is not supported: in binary mode pgoutput sends each value in its type's "
    "send() form, which pgrouter cannot turn into the documented text form for every type "
    "(extension types, money, tsvector, …); remove it (records carry the text form)")


def validate(cfg: Config, *, source: str = "<config>") -> None:
    if not cfg.source.publications:
        raise ConfigError("at least one publication is needed", path="source.publications",
                          source=source)
    if not SLOT_NAME.match(cfg.source.slot):
        raise ConfigError(f"invalid replication slot name {cfg.source.slot!r}: PostgreSQL "
                          "allows 1-63 lower-case letters, digits and underscores",
                          path="source.slot", source=source)
    try:
        dsns.validate(cfg.source.dsn, path="source.dsn")
        parse_bootstrap_servers(cfg.kafka.bootstrap_servers)
    except ConfigError as exc:
        raise ConfigError(str(exc), source=source) from exc
    if record_format(cfg.kafka).registers and cfg.kafka.registry is None:
        raise ConfigError('format = "avro" needs a schema registry: a [kafka.registry] table '
                          'with its url', path="kafka.registry", source=source)
    if cfg.kafka.registry is not None and not cfg.kafka.registry.url.startswith(
            ("http://", "https://")):
        raise ConfigError("the registry url must start with http:// or https://",
                          path="kafka.registry.url", source=source)
    if not cfg.routes and not cfg.message_routes:
        raise ConfigError("at least one [[routes]] entry is needed", path="routes", source=source)
    if cfg.source.binary:
        raise ConfigError(BINARY_REFUSED, path="source.binary", source=source)
    parse_policy(cfg.origin, path="origin", source=source)
    for key in ("schema_topic", "messages_topic", "transactions_topic", "committed_lsn_topic"):
        topic = getattr(cfg.kafka, key)
        problem = (topic or key in ("schema_topic", "committed_lsn_topic")) and illegal(topic)
        if problem:
            raise ConfigError(f"topic {problem}", path=f"kafka.{key}", source=source)
    names = set()
    for i, route in enumerate(cfg.routes):
        where = f"routes[{i}]"
        parse_policy(route.origin, path=f"{where}.origin", source=source)
        claim_route_name(route.name, names, f"{where}.name", source)
        chosen = sum((bool(route.tables), bool(route.schemas), route.all_tables,
                      bool(route.publication), bool(route.publications)))
        if chosen != 1:
            raise ConfigError("give exactly one of tables, schemas, all_tables = true, "
                              "publication or publications", path=where, source=source)
        _validate_route_filter(route, where, source)
        validate_transforms(route.transforms, where, source)
        validate_outbox(route, where, source, cfg.kafka.format)
        validate_compacted(route, where, source, cfg.kafka.format)
        for j, t in enumerate(route.tables):
            _qualified(t, path=f"{where}.tables[{j}]", source=source)
        if not route.operations:
            raise ConfigError("at least one operation", path=f"{where}.operations", source=source)
        problem = template_problem(route.topic, _TOPIC_FIELDS)
        if problem:
            raise ConfigError(problem, path=f"{where}.topic", source=source)
    validate_message_routes(cfg.message_routes, names, cfg.source.messages, source)
    if not cfg.snapshot.state_topic or not _TOPIC_CHARS.match(cfg.snapshot.state_topic):
        raise ConfigError("a topic name (letters, digits, '.', '_' and '-')",
                          path="snapshot.state_topic", source=source)
    # the common settings vocabulary, checked for the chosen client (router.config.kafka_settings)
    translate_kafka_settings(dict(cfg.kafka.settings), cfg.kafka.client, source=source)
    _validate_metrics(cfg.metrics, source)
    validate_console(cfg.console, source=source)
    validate_exactly_once(cfg.kafka, source=source)
    validate_ha(cfg.ha, source=source)


def parse_listen(listen: str, *, path: str = "metrics.listen",
                 source: str = "<config>") -> tuple[str, int]:
    """``host:port`` (``[::1]:9187`` for IPv6) -> ``(host, port)``."""
    host, colon, port = listen.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"expected host:port (e.g. 127.0.0.1:9187), got {listen!r}",
                          path=path, source=source)
    return host, int(port)


def _validate_metrics(m: MetricsConfig, source: str) -> None:
    if m.listen:
        parse_listen(m.listen, source=source)
    if not m.sample_interval > 0:
        raise ConfigError("must be > 0", path="metrics.sample_interval", source=source)
    for key in ("lag_warning_bytes", "lag_warning_seconds"):
        if getattr(m, key) < 0:
            raise ConfigError("must be ≥ 0 (0 = no warning)", path=f"metrics.{key}",
                              source=source)


def _validate_route_filter(route: RouteConfig, where: str, source: str) -> None:
    """``where``/``columns`` are what ``FOR TABLE t WHERE (…) (cols)`` allows: only with
    ``tables``; the filter's syntax is checked here (types once the table is known)."""
    if len(set(route.publications)) != len(route.publications):
        raise ConfigError("publication named twice", path=f"{where}.publications",
                          source=source)
    for key, value in (("where", route.where), ("columns", route.columns)):
        if value and not route.tables:
            raise ConfigError(f"{key} needs tables = [...] (publications bring their own "
                              "filters and column lists; PostgreSQL allows none with schemas "
                              "or all tables)", path=f"{where}.{key}", source=source)
    if len(set(route.columns)) != len(route.columns):
        raise ConfigError("column named twice", path=f"{where}.columns", source=source)
    if route.where:
        from ..rowfilter.parser import parse  # syntax only; types need the table's columns

        try:
            parse(route.where)
        except ConfigError as exc:
            raise ConfigError(str(exc), path=f"{where}.where", source=source) from exc


def qualified(name: str) -> tuple[str, str]:
    return _qualified(name, path="", source="")


def mask_dsn(dsn: str) -> str:
    """Hide the password of a ``postgresql://user:secret@host/db`` URL or ``password=`` pair."""
    return dsns.mask(dsn)
