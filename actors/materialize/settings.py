"""The materializer's settings: ``JobConfig``, built from a TOML file's dict and validated
without msgspec, so the job needs only the standard library, pyspark and delta-spark under
``spark-submit`` (``config.py`` adds msgspec's key-path errors for ``pgrouter materialize``).

Rules: unknown keys and wrong types raise ``MaterializeError`` naming their path; ``delta.mode``
is ``state`` or ``changelog``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from typing import Any

STATE, CHANGELOG = "state", "changelog"


class MaterializeError(Exception):
    """The job cannot go on without losing data or guessing (bad config, missing schema,
    incompatible type change, keyless table in state mode)."""

    def __init__(self, message: str, *, path: str | None = None):
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


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
    mode: str = STATE
    trigger_interval: str | None = None  # None: next batch as soon as the previous ends
    master: str = "local[*]"
    app_name: str = "pgrouter-materialize"
    spark_conf: dict[str, str] = field(default_factory=dict)
    jars: list[str] = field(default_factory=list)


#: section -> key -> (type, JobConfig field). The stdlib twin of ``config.py``'s msgspec
#: Structs, so a bare ``spark-submit`` needs nothing but pyspark.
_KEYS: dict[str, dict[str, tuple[type, str]]] = {
    "kafka": {"bootstrap_servers": (str, "bootstrap_servers"), "topics": (list, "topics"),
              "topic_pattern": (str, "topic_pattern"), "schema_topic": (str, "schema_topic"),
              "starting_offsets": (str, "starting_offsets"),
              "max_offsets_per_trigger": (int, "max_offsets_per_trigger"),
              "options": (dict, "kafka_options")},
    "spark": {"master": (str, "master"), "app_name": (str, "app_name"),
              "conf": (dict, "spark_conf"), "jars": (list, "jars")},
    "delta": {"warehouse": (str, "warehouse"), "checkpoint": (str, "checkpoint"),
              "mode": (str, "mode"), "trigger_interval": (str, "trigger_interval"),
              "max_offsets_per_trigger": (int, "max_offsets_per_trigger")},
}


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
            if not isinstance(value, typ) or isinstance(value, bool):
                raise MaterializeError(f"expected {typ.__name__}", path=f"{prefix}{key}")
            if name in values:
                raise MaterializeError("given twice", path=f"{prefix}{key}")
            values[name] = value
    return validate(values)


def validate(values: dict[str, Any]) -> JobConfig:
    for need, where in (("bootstrap_servers", "kafka"), ("warehouse", "delta"),
                        ("checkpoint", "delta")):
        if not values.get(need):
            raise MaterializeError("required", path=f"{where}.{need}")
    if bool(values.get("topics")) == bool(values.get("topic_pattern")):
        raise MaterializeError("give exactly one of topics (a non-empty list) or topic_pattern",
                               path="kafka.topics")
    if values.get("mode", STATE) not in (STATE, CHANGELOG):
        raise MaterializeError("must be 'state' or 'changelog'", path="delta.mode")
    if values.get("max_offsets_per_trigger") is not None and values["max_offsets_per_trigger"] < 1:
        raise MaterializeError("must be >= 1", path="max_offsets_per_trigger")
    values["spark_conf"] = {k: str(v).lower() if isinstance(v, bool) else str(v)
                            for k, v in values.get("spark_conf", {}).items()}
    values["kafka_options"] = {k: str(v) for k, v in values.get("kafka_options", {}).items()}
    return JobConfig(**values)


def load_config(path: str) -> JobConfig:
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise MaterializeError(f"cannot read {path}: {exc}") from exc
    return config_from_dict(raw)
