"""router.delivery.exactly_once: the committed-LSN record and the mode's configuration (pure)."""

from __future__ import annotations

import pytest

from router.config.router import parse_config
from router.errors import ConfigError, SinkRejected, is_retryable
from router.delivery.exactly_once import (ProducerFenced, Stream, already_in_kafka,
                                 committed_lsn, decode_committed, foreign_stream, committed_record,
                                 transactional_id)
from tests.helpers import config_head

CONFIG = config_head("postgresql://x@h/db") + """exactly_once = true
{extra}
[[routes]]
name = "r"
tables = ["public.t"]
"""


STREAM = Stream(system_id="7711944412465532092", db="shop", slot="s")


def test_progress_record_round_trip_names_the_stream():
    key, value = committed_record("pgrouter-s", 0x1_0000_00FF, STREAM)
    assert key == b"pgrouter-s"
    assert value == (b'{"end_lsn":"1/FF","slot":"s","system_id":"7711944412465532092",'
                     b'"db":"shop"}')
    assert committed_lsn("pgrouter-s", decode_committed(value), STREAM,
                              wal_end=0x2_0000_0000) == 0x1_0000_00FF
    assert decode_committed(None) is None  # nothing committed yet / tombstone
    assert committed_lsn("pgrouter-s", None, STREAM, wal_end=5) == 0


def test_a_foreign_progress_record_is_a_config_error():
    with pytest.raises(ConfigError, match="kafka.committed_lsn_topic"):
        decode_committed(b'{"offset": 3}')


@pytest.mark.parametrize("other", [
    Stream(system_id="7711944412465532092", db="shop", slot="other"),   # two slots, one id
    Stream(system_id="1234", db="shop", slot="s"),                      # same slot, 2 servers
    Stream(system_id="7711944412465532092", db="crm", slot="s")])       # another database
def test_another_streams_progress_is_refused_never_skipped_by(other):
    _, value = committed_record("shared", 0x10, other)
    progress = decode_committed(value)
    assert foreign_stream(progress, STREAM)
    with pytest.raises(ConfigError) as info:
        committed_lsn("shared", progress, STREAM, wal_end=0x1_0000_0000)
    assert info.value.path == "kafka.transactional_id"
    assert other.describe() in str(info.value) and STREAM.describe() in str(info.value)


def test_a_position_past_the_servers_wal_end_is_refused():
    _, value = committed_record("pgrouter-s", 0xDDC2D320, STREAM)
    with pytest.raises(ConfigError, match="past the server's WAL end 0/2068580"):
        committed_lsn("pgrouter-s", decode_committed(value), STREAM, wal_end=0x2068580)


def test_a_record_that_names_no_stream_is_not_used():
    progress = decode_committed(b'{"end_lsn":"0/DDC2D320","slot":"s"}')  # an older pgrouter's
    assert not foreign_stream(progress, STREAM)
    assert committed_lsn("pgrouter-s", progress, STREAM, wal_end=0xFFFFFFFF) == 0


@pytest.mark.parametrize("end, committed, skipped", [(10, 10, True), (9, 10, True),
                                                     (11, 10, False), (1, 0, False)])
def test_transactions_up_to_the_committed_progress_are_skipped(end, committed, skipped):
    assert already_in_kafka(end, committed) is skipped


def test_transactional_id_defaults_to_the_stream():
    assert transactional_id("", STREAM) == "pgrouter-s-shop-7711944412465532092"
    assert transactional_id("mine", STREAM) == "mine"


def test_fenced_is_never_retried():
    assert issubclass(ProducerFenced, SinkRejected)
    assert not is_retryable(ProducerFenced("fenced"))


@pytest.mark.parametrize("extra, path", [
    ('committed_lsn_topic = "pgrouter.schemas"', "kafka.committed_lsn_topic"),
    ('committed_lsn_topic = "bad topic"', "kafka.committed_lsn_topic"),
    ('progress_topic = "bad topic"', "kafka.committed_lsn_topic"),
    ("transaction_interval_ms = -1", "kafka.transaction_interval_ms"),
    ("transaction_interval_ms = 75000", "kafka.transaction_interval_ms"),
    ('format = "avro"', "kafka.registry"),
    ('format = "xml"', "kafka.format"),
])
def test_bad_settings_name_their_key(extra, path):
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        parse_config(CONFIG.format(extra=extra), source="router.toml")


def test_defaults():
    cfg = parse_config(CONFIG.format(extra=""), source="router.toml")
    assert (cfg.kafka.exactly_once, cfg.kafka.committed_lsn_topic, cfg.kafka.format,
            cfg.kafka.transaction_interval_ms) == (True, "pgrouter.progress", "json", 100)


@pytest.mark.parametrize("section, old, new, value", [
    ("kafka", "progress_topic", "committed_lsn_topic", "p.one"),
    ("snapshot", "progress_topic", "state_topic", "s.one"),
])
def test_a_renamed_key_is_read_under_its_old_name_with_a_warning(section, old, new, value):
    if section == "kafka":
        text = CONFIG.format(extra=f'{old} = "{value}"')
    else:
        text = CONFIG.format(extra="") + f'\n[{section}]\n{old} = "{value}"\n'
    notes: list[str] = []
    cfg = parse_config(text, source="router.toml", notes=notes)
    assert getattr(getattr(cfg, section), new) == value
    assert notes == [f"router.toml: {section}.{old} is now called {section}.{new}; the old "
                     "name is read for one more release"]
    both = text.replace(f'{old} = "{value}"', f'{old} = "{value}"\n{new} = "x"')
    with pytest.raises(ConfigError, match=f"{section}.{new} is set, and also"):
        parse_config(both, source="router.toml")
