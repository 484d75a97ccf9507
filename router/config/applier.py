"""The applier's configuration file (``pgrouter apply -c FILE``), decoded with msgspec.

Rules as in ``router.config.router``: unknown keys and wrong types are rejected with the key's path;
values are checked once here. Example::

    [kafka]
    bootstrap_servers = "127.0.0.1:9092"
    transactions_topic = "node_a.transactions"   # the router's [kafka] transactions_topic
    topics = ["node_a.*"]                        # data topics to apply (globs); default all

    [target]
    dsn = "postgresql://postgres@node-b/app"
    origin = "node_a"          # replication origin the applied transactions are tagged with
    conflict = "error"         # error | skip | upsert (last writer wins)
    memory_limit = 67108864    # bytes of records waiting for their END before spilling
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec

from ..postgres import dsn as dsns
from .router import LogConfig, RegistryConfig, parse_listen
from .files import decode_toml, read_config_text
from .console import ConsoleConfig, validate_console
from ..errors import ConfigError
from ..postgres.identifiers import split_qualified
from .kafka_settings import parse_bootstrap_servers

_ORIGIN_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,63}$")


class _Base(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class ApplyKafka(_Base):
    bootstrap_servers: str | list[str]
    transactions_topic: str
    #: consumer client: librdkafka (confluent-kafka) when installed, else kafka-python
    client: Literal["auto", "librdkafka", "kafka-python"] = "auto"
    #: glob patterns of the data topics to apply; records on other topics are ignored
    topics: list[str] = msgspec.field(default_factory=lambda: ["*"])
    #: passed to the client as they are: librdkafka properties ("security.protocol") or
    #: kafka-python KafkaConsumer arguments ("security_protocol"); pin ``client`` with them
    settings: dict[str, str | int | float | bool] = {}
    #: seconds a poll waits for records
    poll_timeout: Annotated[float, msgspec.Meta(gt=0)] = 0.2
    #: the schema registry of data topics the router writes with ``format = "avro"`` (the
    #: router's ``[kafka.registry]``); records are told apart by their first byte
    registry: RegistryConfig | None = None


class ApplyTarget(_Base):
    dsn: str
    #: replication origin name (created when missing); the target's own router sees the
    #: applied transactions with this origin and can drop them (origin = "none")
    origin: str
    conflict: Literal["error", "skip", "upsert"] = "error"
    #: source "schema.table" -> target "schema.table" (default: the same name)
    tables: dict[str, str] = {}
    #: where the Kafka offsets of what was applied are stored, in the same transactions
    #: (created when missing; one row per origin)
    progress_table: str = "public.pgrouter_apply_progress"
    #: the applier session's synchronous_commit; "off" like PostgreSQL's own apply worker:
    #: a transaction lost in a crash of the target is lost with its origin progress and its
    #: stored offsets, so it is applied again
    synchronous_commit: Literal["on", "off", "local", "remote_write", "remote_apply"] = "off"
    #: bytes of records waiting for their transaction's END kept in memory; past it the
    #: largest transactions spill to temporary files in ``spill_dir``
    memory_limit: int = 64 * 1024 * 1024
    spill_dir: str | None = None
    #: consecutive source transactions applied in one target transaction, up to this many
    #: rows together (the origin moves to the last one's commit with it; one that fails is
    #: found by applying them again one by one); 1 (the default): a target transaction per
    #: source transaction, as PostgreSQL's apply worker does
    group_rows: Annotated[int, msgspec.Meta(ge=1)] = 1000


class ApplyMetrics(_Base):
    #: ``host:port`` of the applier's /metrics, /healthz and /readyz (``""``: none)
    listen: str = ""


class ApplyConfig(_Base):
    kafka: ApplyKafka
    target: ApplyTarget
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    metrics: ApplyMetrics = msgspec.field(default_factory=ApplyMetrics)
    console: ConsoleConfig = msgspec.field(default_factory=ConsoleConfig)


def parse_apply_config(text: str, *, source: str = "<config>") -> ApplyConfig:
    cfg = decode_toml(text, ApplyConfig, source=source)
    try:
        dsns.validate(cfg.target.dsn, path="target.dsn")
        parse_bootstrap_servers(cfg.kafka.bootstrap_servers)
    except ConfigError as exc:
        raise ConfigError(str(exc), source=source) from exc
    if not cfg.kafka.transactions_topic:
        raise ConfigError("the router's transactions topic is needed to apply whole "
                          "transactions", path="kafka.transactions_topic", source=source)
    if not cfg.kafka.topics:
        raise ConfigError("at least one topic pattern", path="kafka.topics", source=source)
    if not _ORIGIN_NAME.match(cfg.target.origin) or cfg.target.origin.startswith("pg_"):
        raise ConfigError("origin names use 1-63 letters, digits, '_', '.', '-' and must not "
                          "start with pg_", path="target.origin", source=source)
    if cfg.target.memory_limit < 1024 * 1024:
        raise ConfigError("at least 1 MiB (1048576)", path="target.memory_limit", source=source)
    if cfg.metrics.listen:
        parse_listen(cfg.metrics.listen, source=source)
    validate_console(cfg.console, source=source)
    try:
        split_qualified(cfg.target.progress_table, schema_needed=True)
    except ValueError as exc:
        raise ConfigError(str(exc), path="target.progress_table", source=source) from None
    for src_name, dst_name in cfg.target.tables.items():
        for name in (src_name, dst_name):
            try:
                split_qualified(name, schema_needed=True)
            except ValueError as exc:
                raise ConfigError(str(exc), path=f"target.tables.{src_name}",
                                  source=source) from None
    return cfg


def table_map(target: ApplyTarget) -> dict[tuple[str, str], tuple[str, str]]:
    """``target.tables`` as (schema, table) pairs (names as ``split_qualified`` reads them)."""
    return {split_qualified(k, schema_needed=True): split_qualified(v, schema_needed=True)
            for k, v in target.tables.items()}


def load_apply_config(path: str) -> ApplyConfig:
    return parse_apply_config(read_config_text(path), source=path)


__all__ = ["ApplyConfig", "ApplyKafka", "ApplyTarget", "load_apply_config",
           "parse_apply_config"]
