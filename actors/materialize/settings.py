"""The materializer's settings: ``JobConfig``, built from a TOML file's dict and validated
without msgspec, so the job needs only the standard library, pyspark and delta-spark under
``spark-submit`` (``config.py`` adds msgspec's key-path errors for ``pgrouter materialize``).

Rules: unknown keys and wrong types raise ``MaterializeError`` naming their path; ``delta.mode``
is ``state`` or ``changelog``; ``[kafka.registry]`` (Avro topics) takes the router's
``[kafka.registry]`` keys, of which a reader uses the url, credentials, TLS files and timeout.
"""

from __future__ import annotations

import re

import tomllib
from dataclasses import dataclass, field
from typing import Any

STATE, CHANGELOG = "state", "changelog"
DELTA, ICEBERG = "delta", "iceberg"


class MaterializeError(Exception):
    """The job cannot go on without losing data or guessing (bad config, missing schema,
    incompatible type change, keyless table in state mode)."""

    def __init__(self, message: str, *, path: str | None = None):
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


def reason(exc: BaseException) -> str:
    """One line saying why a Spark action failed: the Python exception line of a failed Python
    worker (``ValueError: ...``), else the first line of the (Java) message."""
    text = str(getattr(exc, "_desc", None) or exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception): ", ln):
            return ln
    return lines[0] if lines else type(exc).__name__


@dataclass
class RegistrySettings:
    """``[kafka.registry]``: the schema registry that Avro records name their schemas in (its
    Confluent-compatible API), with the attributes ``actors.kafka.registry.RegistryClient``
    reads. The router's writer-only keys (``subject_naming``, ``compatibility``,
    ``auto_register``) are accepted, so one table can serve both, and unused."""

    url: str
    username: str = ""
    password: str = field(default="", repr=False)
    ssl_ca_location: str = ""
    ssl_certificate_location: str = ""
    ssl_key_location: str = ""
    timeout: float = 10.0
    subject_naming: str = "topic"
    compatibility: str = ""
    auto_register: bool = True


@dataclass
class JobConfig:
    bootstrap_servers: str
    warehouse: str
    checkpoint: str
    topics: list[str] = field(default_factory=list)
    topic_pattern: str | None = None
    schema_topic: str = "pgrouter.schemas"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    kafka_options: dict[str, str] = field(default_factory=dict)
    registry: RegistrySettings | None = None  # Avro topics: where their schemas are
    mode: str = STATE
    trigger_interval: str | None = None  # None: next batch as soon as the previous ends
    master: str = "local[*]"
    app_name: str = "pgrouter-materialize"
    spark_conf: dict[str, str] = field(default_factory=dict)
    jars: list[str] = field(default_factory=list)
    class_archive: str | None = None  # directory of the driver's class-data archive
    # table maintenance (``maintenance.py``), run after a micro-batch at most this often
    maintenance_interval: str = "1 hour"
    tombstone_retention: str | None = None  # None: tombstones are kept for ever
    optimize: bool = False
    vacuum_retention: str | None = None  # None: no VACUUM
    # ``[output] format``: Delta tables at ``warehouse`` or Iceberg tables in ``[iceberg]``'s
    # catalog (``iceberg.py``)
    output_format: str = DELTA
    iceberg_catalog: str = "hadoop"  # "hadoop" (files only) or "jdbc" (a PostgreSQL database)
    iceberg_name: str = "pgrouter"  # the catalog's name in the Spark session
    iceberg_uri: str | None = None  # jdbc: jdbc:postgresql://host:port/db
    iceberg_user: str | None = None
    iceberg_password: str | None = field(default=None, repr=False)
    iceberg_warehouse: str | None = None
    iceberg_options: dict[str, str] = field(default_factory=dict)  # more catalog properties
    compact_interval: str | None = "1 hour"  # Iceberg: compaction schedule; None: never
    snapshot_retention: str = "1 day"  # Iceberg: expire_snapshots older than this


#: section -> key -> (type, JobConfig field). The stdlib twin of ``config.py``'s msgspec
#: Structs, so a bare ``spark-submit`` needs nothing but pyspark.
_KEYS: dict[str, dict[str, tuple[type, str]]] = {
    "kafka": {"bootstrap_servers": (str, "bootstrap_servers"), "topics": (list, "topics"),
              "topic_pattern": (str, "topic_pattern"), "schema_topic": (str, "schema_topic"),
              "starting_offsets": (str, "starting_offsets"),
              "max_offsets_per_trigger": (int, "max_offsets_per_trigger"),
              "options": (dict, "kafka_options"), "registry": (dict, "registry")},
    "spark": {"master": (str, "master"), "app_name": (str, "app_name"),
              "conf": (dict, "spark_conf"), "jars": (list, "jars"),
              "class_archive": (str, "class_archive")},
    "delta": {"warehouse": (str, "warehouse"), "checkpoint": (str, "checkpoint"),
              "mode": (str, "mode"), "trigger_interval": (str, "trigger_interval"),
              "max_offsets_per_trigger": (int, "max_offsets_per_trigger"),
              "maintenance_interval": (str, "maintenance_interval"),
              "tombstone_retention": (str, "tombstone_retention"),
              "optimize": (bool, "optimize"), "vacuum_retention": (str, "vacuum_retention")},
    "output": {"format": (str, "output_format")},
    "iceberg": {"catalog": (str, "iceberg_catalog"), "name": (str, "iceberg_name"),
                "uri": (str, "iceberg_uri"), "user": (str, "iceberg_user"),
                "password": (str, "iceberg_password"), "warehouse": (str, "iceberg_warehouse"),
                "options": (dict, "iceberg_options"),
                "compact_interval": (str, "compact_interval"),
                "snapshot_retention": (str, "snapshot_retention")},
}

_REGISTRY_KEYS = {"url": str, "username": str, "password": str, "ssl_ca_location": str,
                  "ssl_certificate_location": str, "ssl_key_location": str,
                  "timeout": (int, float), "subject_naming": str, "compatibility": str,
                  "auto_register": bool}

_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def duration_seconds(text: str, *, path: str) -> float:
    """``"90 seconds"``, ``"1 hour"``, ``"7 days"`` -> seconds."""
    parts = text.split()
    unit = parts[1].lower().removesuffix("s") if len(parts) == 2 else ""
    try:
        number = float(parts[0])
    except (ValueError, IndexError):
        number = -1.0
    if unit not in _UNITS or number < 0:
        raise MaterializeError(f"expected a duration like \"90 seconds\", \"1 hour\" or "
                               f"\"7 days\", got {text!r}", path=path)
    return number * _UNITS[unit]


def config_from_dict(raw: dict[str, Any]) -> JobConfig:
    values: dict[str, Any] = {}
    for section, body in raw.items():
        if section == "max_offsets_per_trigger":
            body, section_keys = {section: body}, {section: (int, section)}
            prefix = ""
        elif section in _KEYS:
            if not isinstance(body, dict):
                raise MaterializeError("expected a table", path=section)
            section_keys, prefix = _KEYS[section], f"{section}."
        else:
            raise MaterializeError("unknown key", path=section)
        for key, value in body.items():
            if key not in section_keys:
                raise MaterializeError("unknown key", path=f"{prefix}{key}")
            typ, name = section_keys[key]
            if not isinstance(value, typ) or (isinstance(value, bool) and typ is not bool):
                raise MaterializeError(f"expected {typ.__name__}", path=f"{prefix}{key}")
            if name in values:
                raise MaterializeError("given twice", path=f"{prefix}{key}")
            values[name] = value
    return validate(values)


def validate(values: dict[str, Any]) -> JobConfig:
    fmt = values.get("output_format", DELTA)
    if fmt not in (DELTA, ICEBERG):
        raise MaterializeError("must be 'delta' or 'iceberg'", path="output.format")
    needs = [("bootstrap_servers", "kafka.bootstrap_servers"), ("checkpoint", "delta.checkpoint"),
             ("warehouse", "delta.warehouse") if fmt == DELTA else
             ("iceberg_warehouse", "iceberg.warehouse")]
    if fmt == ICEBERG and values.get("iceberg_catalog", "hadoop") == "jdbc":
        needs.append(("iceberg_uri", "iceberg.uri"))
    for need, path in needs:
        if not values.get(need):
            raise MaterializeError("required", path=path)
    if values.get("iceberg_catalog", "hadoop") not in ("hadoop", "jdbc"):
        raise MaterializeError("must be 'hadoop' or 'jdbc'", path="iceberg.catalog")
    if not re.fullmatch(r"[A-Za-z_]\w*", values.get("iceberg_name", "pgrouter")):
        raise MaterializeError("must be a plain identifier", path="iceberg.name")
    if fmt == ICEBERG and not values.get("warehouse"):
        values["warehouse"] = values["iceberg_warehouse"]  # where a hadoop catalog's tables are
    for key in ("compact_interval", "snapshot_retention"):
        if values.get(key) is not None:
            duration_seconds(values[key], path=f"iceberg.{key}")
    values["iceberg_options"] = {k: str(v) for k, v in values.get("iceberg_options", {}).items()}
    if bool(values.get("topics")) == bool(values.get("topic_pattern")):
        raise MaterializeError("give exactly one of topics (a non-empty list) or topic_pattern",
                               path="kafka.topics")
    if values.get("mode", STATE) not in (STATE, CHANGELOG):
        raise MaterializeError("must be 'state' or 'changelog'", path="delta.mode")
    if values.get("max_offsets_per_trigger") is not None and values["max_offsets_per_trigger"] < 1:
        raise MaterializeError("must be >= 1", path="max_offsets_per_trigger")
    for key in ("maintenance_interval", "tombstone_retention", "vacuum_retention"):
        if values.get(key) is not None:
            duration_seconds(values[key], path=f"delta.{key}")
    values["spark_conf"] = {k: str(v).lower() if isinstance(v, bool) else str(v)
                            for k, v in values.get("spark_conf", {}).items()}
    values["kafka_options"] = {k: str(v) for k, v in values.get("kafka_options", {}).items()}
    if isinstance(values.get("registry"), dict):
        values["registry"] = registry_settings(values["registry"])
    return JobConfig(**values)


def registry_settings(raw: dict[str, Any]) -> RegistrySettings:
    for key, value in raw.items():
        typ = _REGISTRY_KEYS.get(key)
        if typ is None:
            raise MaterializeError("unknown key", path=f"kafka.registry.{key}")
        if not isinstance(value, typ) or (isinstance(value, bool) and typ is not bool):
            raise MaterializeError("wrong type", path=f"kafka.registry.{key}")
    if not raw.get("url"):
        raise MaterializeError("required", path="kafka.registry.url")
    if raw.get("timeout", 1) <= 0:
        raise MaterializeError("must be > 0", path="kafka.registry.timeout")
    return RegistrySettings(**raw)


def load_config(path: str) -> JobConfig:
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise MaterializeError(f"cannot read {path}: {exc}") from exc
    return config_from_dict(raw)
