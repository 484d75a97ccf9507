"""``[kafka] client = "auto"`` (the default): librdkafka when confluent-kafka is importable,
else kafka-python; an explicit choice is kept as written."""

from __future__ import annotations

import pytest

from router.config import router as config_module
from router.config.router import parse_config, resolve_client
from router.errors import ConfigError
from tests.helpers import config_head

TEXT = config_head("postgresql://h/db") + """{kafka}
[[routes]]
name = "r"
tables = ["public.t"]
"""


def test_auto_picks_librdkafka_only_when_installed():
    assert resolve_client("auto", True) == "librdkafka"
    assert resolve_client("auto", False) == "kafka-python"
    assert resolve_client("kafka-python", True) == "kafka-python"
    assert resolve_client("librdkafka", False) == "librdkafka"


@pytest.mark.parametrize("installed,want", [(True, "librdkafka"), (False, "kafka-python")])
@pytest.mark.parametrize("kafka", ["", 'client = "auto"'])
def test_default_and_auto_resolve_at_parse(monkeypatch, installed, want, kafka):
    monkeypatch.setattr(config_module, "rdkafka_installed", lambda: installed)
    assert parse_config(TEXT.format(kafka=kafka)).kafka.client == want


@pytest.mark.parametrize("client", ["kafka-python", "librdkafka"])
def test_explicit_client_is_kept(monkeypatch, client):
    monkeypatch.setattr(config_module, "rdkafka_installed", lambda: client != "librdkafka")
    assert parse_config(TEXT.format(kafka=f'client = "{client}"')).kafka.client == client


def test_unknown_client_is_refused():
    with pytest.raises(ConfigError, match="client"):
        parse_config(TEXT.format(kafka='client = "java"'))


def test_installed_probe_matches_the_environment():
    try:
        import confluent_kafka  # noqa: F401
        have = True
    except ImportError:
        have = False
    assert config_module.rdkafka_installed() is have
