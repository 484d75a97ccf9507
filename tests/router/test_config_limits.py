"""Values every command refuses when the config loads: negative or zero numbers, slot names
PostgreSQL refuses, DSNs and broker addresses no client can use."""

from __future__ import annotations

import pytest

from router.config.applier import parse_apply_config
from router.config.router import parse_config
from router.errors import ConfigError
from router.config.kafka_settings import parse_bootstrap_servers


def _cfg(source: str = "", kafka: str = "", route: str = "", dsn: str = "postgresql://h/db",
         slot: str = "s", bootstrap: str = "k:9092") -> str:
    return f"""
[source]
dsn = "{dsn}"
slot = "{slot}"
publications = ["p"]
{source}
[kafka]
bootstrap_servers = "{bootstrap}"
{kafka}
[[routes]]
name = "r"
tables = ["public.t"]
{route}
"""


def test_a_good_config_loads():
    parse_config(_cfg(dsn="host=h dbname=db password='a b'"))


@pytest.mark.parametrize("text, path", [
    (_cfg(source="status_interval = -1"), "source.status_interval"),
    (_cfg(source="status_interval = 0"), "source.status_interval"),
    (_cfg(source="memory_limit = -5"), "source.memory_limit"),
    (_cfg(source="memory_limit = 0"), "source.memory_limit"),
    (_cfg(source="publication_poll_interval = -1"), "source.publication_poll_interval"),
    (_cfg(source="publication_poll_interval = 0"), "source.publication_poll_interval"),
    (_cfg(source="proto_version = 5"), "source.proto_version"),
    (_cfg(route="topic_settings = { partitions = 0 }"), "routes[0].topic_settings.partitions"),
    (_cfg(route="topic_settings = { replication_factor = -1 }"),
     "routes[0].topic_settings.replication_factor"),
    (_cfg() + "[log]\nprogress_interval = -2\n", "log.progress_interval"),
    (_cfg(slot="Bad-Slot"), "source.slot"),
    (_cfg(slot="x" * 64), "source.slot"),
    (_cfg(slot=""), "source.slot"),
    (_cfg(dsn="postgresql//h/db"), "source.dsn"),
    (_cfg(dsn="host=h colour=blue"), "source.dsn"),
    (_cfg(bootstrap="localhost:notaport"), "kafka.bootstrap_servers"),
    (_cfg(bootstrap="a b:9092"), "kafka.bootstrap_servers"),
])
def test_bad_values_are_refused_with_their_path(text, path):
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="c.toml")
    assert f"{path}:" in str(info.value) and str(info.value).startswith("c.toml: ")


def test_apply_config_checks_its_dsn_and_brokers():
    base = """
[kafka]
bootstrap_servers = "{b}"
transactions_topic = "t"
[target]
dsn = "{d}"
origin = "o"
"""
    parse_apply_config(base.format(b="k:1", d="host=h dbname=db"))
    for b, d, path in (("k:1", "nonsense", "target.dsn"), ("k:x", "host=h", "kafka.bootstrap")):
        with pytest.raises(ConfigError, match=path):
            parse_apply_config(base.format(b=b, d=d))


@pytest.mark.parametrize("value, expected", [
    ("k:9092", [("k", 9092)]),
    ("a:1, b", [("a", 1), ("b", 9092)]),
    (["[::1]:9", "SASL_SSL://k.example:9093"], [("::1", 9), ("k.example", 9093)]),
])
def test_bootstrap_servers_parse(value, expected):
    assert parse_bootstrap_servers(value) == expected


@pytest.mark.parametrize("value", ["", "k:0", "k:65536", "k:1:2", "k:", [], ["k:9092", " "]])
def test_bad_bootstrap_servers(value):
    with pytest.raises(ConfigError, match="kafka.bootstrap_servers"):
        parse_bootstrap_servers(value)
