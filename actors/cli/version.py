"""``pgrouter --version``: the versions a bug report needs, one per line — pgrouter, Python,
whether the C hot path is active, the Kafka clients (and librdkafka's own version), the
PostgreSQL drivers (and the libpq psycopg2 was built with), trio, msgspec, Spark and Delta
when installed. Nothing here connects anywhere."""

from __future__ import annotations

import argparse
import platform
import sys

from router import __version__

#: (distribution, label) of the libraries whose versions matter in a report
LIBRARIES = [("kafka-python", "kafka-python"), ("confluent-kafka", "confluent-kafka"),
             ("psycopg2-binary", "psycopg2"), ("asyncpg", "asyncpg"), ("trio", "trio"),
             ("msgspec", "msgspec"), ("pyspark", "pyspark"), ("delta-spark", "delta-spark")]


def _dist(name: str) -> str | None:
    # imported here: it costs more than every other import of a command's start
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _detail(label: str) -> str:
    try:
        if label == "confluent-kafka":
            import confluent_kafka

            return f" (librdkafka {confluent_kafka.libversion()[0]})"
        if label == "psycopg2":
            import psycopg2.extensions

            v = psycopg2.extensions.libpq_version()
            return f" (libpq {v // 10000}.{v % 100})"
    except Exception:  # a library that does not load says so in its own line
        return " (installed, does not load)"
    return ""


def report() -> str:
    from router.native import NATIVE

    hot = ("native (router._native)" if NATIVE is not None
           else "python (the C accelerator is not built or PGROUTER_PURE_PYTHON is set)")
    lines = [f"pgrouter {__version__}",
             f"python {platform.python_version()} ({platform.python_implementation()}, "
             f"{sys.platform} {platform.machine()})",
             f"hot path: {hot}"]
    for dist, label in LIBRARIES:
        version = _dist(dist)
        lines.append(f"{label} {version}{_detail(label)}" if version
                     else f"{label}: not installed")
    return "\n".join(lines)


class VersionAction(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print the versions a bug report needs and exit"):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(report())
        parser.exit()
