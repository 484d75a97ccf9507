"""router.exactly_once: the progress record and the mode's configuration (pure)."""

from __future__ import annotations

import pytest

from router.config import parse_config
from router.errors import ConfigError, SinkRejected, is_retryable
from router.exactly_once import (ProducerFenced, already_in_kafka, progress_record,
                                 read_progress, transactional_id)

CONFIG = """
[source]
dsn = "postgresql://x@h/db"
slot = "s"
publications = ["p"]
[kafka]
bootstrap_servers = "k:9092"
exactly_once = true
{extra}
[[routes]]
name = "r"
tables = ["public.t"]
"""


def test_progress_record_round_trip():
    key, value = progress_record("pgrouter-s", 0x1_0000_00FF, "s")
    assert key == b"pgrouter-s"
    assert value == b'{"end_lsn":"1/FF","slot":"s"}'
    assert read_progress(value) == 0x1_0000_00FF
    assert read_progress(None) == 0  # nothing committed yet / tombstone


def test_a_foreign_progress_record_is_a_config_error():
    with pytest.raises(ConfigError, match="kafka.progress_topic"):
        read_progress(b'{"offset": 3}')


@pytest.mark.parametrize("end, committed, skipped", [(10, 10, True), (9, 10, True),
                                                     (11, 10, False), (1, 0, False)])
def test_transactions_up_to_the_committed_progress_are_skipped(end, committed, skipped):
    assert already_in_kafka(end, committed) is skipped


def test_transactional_id_defaults_to_the_slot():
    assert transactional_id("", "orders") == "pgrouter-orders"
    assert transactional_id("mine", "orders") == "mine"


def test_fenced_is_never_retried():
    assert issubclass(ProducerFenced, SinkRejected)
    assert not is_retryable(ProducerFenced("fenced"))


@pytest.mark.parametrize("extra, path", [
    ('progress_topic = "pgrouter.schemas"', "kafka.progress_topic"),
    ('progress_topic = "bad topic"', "kafka.progress_topic"),
    ("transaction_interval_ms = -1", "kafka.transaction_interval_ms"),
    ('format = "avro"', "kafka.format"),
])
def test_bad_settings_name_their_key(extra, path):
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        parse_config(CONFIG.format(extra=extra), source="router.toml")


def test_defaults():
    cfg = parse_config(CONFIG.format(extra=""), source="router.toml")
    assert (cfg.kafka.exactly_once, cfg.kafka.progress_topic, cfg.kafka.format,
            cfg.kafka.transaction_interval_ms) == (True, "pgrouter.progress", "json", 100)
