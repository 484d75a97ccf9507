"""``pgrouter materialize`` configuration: TOML validated with msgspec.

Rules: unknown keys are rejected with their path (``kafka.topicz``); ``[kafka.registry]`` is
the router's ``RegistryConfig``; exactly one of
``kafka.topics`` / ``kafka.topic_pattern``; ``delta.mode`` is ``state`` or ``changelog``;
``max_offsets_per_trigger`` may sit at top level or in ``[kafka]`` (not both). The result is the
job's own ``JobConfig``, so the job (``settings.py``) stays free of msgspec for ``spark-submit``.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from router.config.router import RegistryConfig
from router.errors import ConfigError

from .settings import JobConfig, MaterializeError, validate

_opts = dict(forbid_unknown_fields=True, kw_only=True)


class KafkaSection(msgspec.Struct, **_opts):
    bootstrap_servers: str
    topics: list[str] = []
    topic_pattern: str | None = None
    schema_topic: str = "pgrouter.schemas"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    options: dict[str, str] = {}
    #: Avro topics (``[kafka] format = "avro"`` of the router): the router's table, read for
    #: its url, credentials, TLS files and timeout
    registry: RegistryConfig | None = None


class SparkSection(msgspec.Struct, **_opts):
    master: str = "local[*]"
    app_name: str = "pgrouter-materialize"
    conf: dict[str, str | int | float | bool] = {}
    jars: list[str] = []
    class_archive: str | None = None


class DeltaSection(msgspec.Struct, **_opts):
    warehouse: str | None = None  # required with [output] format = "delta"
    checkpoint: str
    mode: Literal["state", "changelog"] = "state"
    trigger_interval: str | None = None
    max_offsets_per_trigger: int | None = None
    maintenance_interval: str = "1 hour"
    tombstone_retention: str | None = None
    optimize: bool = False
    vacuum_retention: str | None = None


class OutputSection(msgspec.Struct, **_opts):
    format: Literal["delta", "iceberg"] = "delta"


class IcebergSection(msgspec.Struct, **_opts):
    catalog: Literal["hadoop", "jdbc"] = "hadoop"
    name: str = "pgrouter"
    uri: str | None = None
    user: str | None = None
    password: str | None = None
    warehouse: str | None = None
    options: dict[str, str] = {}
    compact_interval: str | None = "1 hour"
    snapshot_retention: str = "1 day"


class MaterializeConfig(msgspec.Struct, **_opts):
    kafka: KafkaSection
    delta: DeltaSection
    output: OutputSection = msgspec.field(default_factory=OutputSection)
    iceberg: IcebergSection = msgspec.field(default_factory=IcebergSection)
    spark: SparkSection = msgspec.field(default_factory=SparkSection)
    max_offsets_per_trigger: int | None = None


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_UNKNOWN = re.compile(r"unknown field `(?P<name>[^`]+)`")
_MISSING = re.compile(r"missing required field `(?P<name>[^`]+)`")


def _path(error: str) -> tuple[str, str | None]:
    m = _AT.match(error)
    msg, path = m.group("msg"), (m.group("path") or "").lstrip(".")
    path = re.sub(r"\[(\d+)\]", r"[\1]", path)
    extra = _UNKNOWN.search(msg) or _MISSING.search(msg)
    if extra:
        path = f"{path}.{extra.group('name')}" if path else extra.group("name")
        msg = "unknown key" if _UNKNOWN.search(msg) else "required key missing"
    return msg, path or None


def parse(text: str | bytes, *, source: str | None = None) -> JobConfig:
    try:
        cfg = msgspec.toml.decode(text, type=MaterializeConfig)
    except msgspec.ValidationError as exc:
        msg, path = _path(str(exc))
        raise ConfigError(msg, path=path, source=source) from exc
    except msgspec.DecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", source=source) from exc
    k, s, d = cfg.kafka, cfg.spark, cfg.delta
    given = [(p, v) for p, v in (("max_offsets_per_trigger", cfg.max_offsets_per_trigger),
                                 ("kafka.max_offsets_per_trigger", k.max_offsets_per_trigger),
                                 ("delta.max_offsets_per_trigger", d.max_offsets_per_trigger))
             if v is not None]
    if len(given) > 1:
        raise ConfigError("given more than once", path=given[1][0], source=source)
    values = dict(bootstrap_servers=k.bootstrap_servers, topics=list(k.topics),
                  topic_pattern=k.topic_pattern, schema_topic=k.schema_topic,
                  starting_offsets=k.starting_offsets,
                  max_offsets_per_trigger=given[0][1] if given else None,
                  kafka_options=dict(k.options), registry=_registry(k.registry), mode=d.mode,
                  warehouse=d.warehouse,
                  checkpoint=d.checkpoint, trigger_interval=d.trigger_interval, master=s.master,
                  app_name=s.app_name, spark_conf=_conf_strings(s.conf), jars=list(s.jars),
                  class_archive=s.class_archive,
                  maintenance_interval=d.maintenance_interval,
                  tombstone_retention=d.tombstone_retention, optimize=d.optimize,
                  vacuum_retention=d.vacuum_retention, output_format=cfg.output.format,
                  **{f"iceberg_{f}": getattr(cfg.iceberg, f) for f in
                     ("catalog", "name", "uri", "user", "password", "warehouse", "options")},
                  compact_interval=cfg.iceberg.compact_interval,
                  snapshot_retention=cfg.iceberg.snapshot_retention)
    try:
        return validate(values)
    except MaterializeError as exc:
        raise ConfigError(str(exc).split(": ", 1)[-1], path=exc.path, source=source) from exc


def _registry(r: RegistryConfig | None) -> dict | None:
    return None if r is None else {f: getattr(r, f) for f in r.__struct_fields__}


def _conf_strings(conf: dict) -> dict[str, str]:
    return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in conf.items()}


def load(path: str) -> JobConfig:
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", source=str(path)) from exc
    return parse(text, source=str(path))
