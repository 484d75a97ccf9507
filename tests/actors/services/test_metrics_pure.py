"""The metrics' own bookkeeping: the commit clock behind ``pgrouter_lag_seconds``, per-topic
record counts from one chunk, and the ``[metrics]`` config section's checks."""

from __future__ import annotations

import pytest

from actors.services.metrics import PG_EPOCH, CommitClock, Metrics
from router.config.router import parse_config
from router.errors import ConfigError
from tests.helpers import config_head

BASE = config_head("postgresql://x@h/db") + """[[routes]]
name = "r"
all_tables = true
"""


def us(unix_seconds: float) -> int:
    return int((unix_seconds - PG_EPOCH) * 1e6)


def test_commit_clock_ages_the_oldest_unconfirmed_transaction():
    confirmed = {"lsn": 0}
    clock = CommitClock()
    clock.confirmed_lsn = lambda: confirmed["lsn"]
    assert clock.lag_seconds(now=2e9) == 0.0
    clock.routed(100, us(2e9 - 30))
    clock.routed(200, us(2e9 - 10))
    assert clock.lag_seconds(now=2e9) == pytest.approx(30)
    confirmed["lsn"] = 100  # the first is confirmed: the second is now the oldest
    assert clock.lag_seconds(now=2e9) == pytest.approx(10)
    confirmed["lsn"] = 250
    assert clock.lag_seconds(now=2e9) == 0.0


def test_commit_clock_stays_bounded_without_scrapes():
    clock = CommitClock()
    clock.confirmed_lsn = lambda: 10**12
    for i in range(10 * CommitClock.TRIM_EVERY):
        clock.routed(i, 0)
    assert len(clock._pending) < CommitClock.TRIM_EVERY


def test_produced_counts_records_and_bytes_per_topic():
    m = Metrics()
    m.topic_route("a.t", "a")
    m.produced([("a.t", b"k1", b"vvv", None), ("b.t", None, b"v", None), ("a.t", b"", b"w", None)])
    reg = m.registry
    assert reg.get_sample_value("pgrouter_records_produced_total",
                                {"route": "a", "topic": "a.t"}) == 2
    assert reg.get_sample_value("pgrouter_produced_bytes_total",
                                {"route": "a", "topic": "a.t"}) == 2 + 3 + 1
    assert reg.get_sample_value("pgrouter_records_produced_total",
                                {"route": "", "topic": "b.t"}) == 1


@pytest.mark.parametrize("section, path", [
    ('listen = "localhost"', "metrics.listen"),
    ('listen = "h:99999"', "metrics.listen"),
    ("sample_interval = 0", "metrics.sample_interval"),
    ("lag_warning_bytes = -1", "metrics.lag_warning_bytes"),
])
def test_bad_metrics_settings_name_their_key(section, path):
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        parse_config(BASE + "[metrics]\n" + section + "\n")


def test_metrics_settings_parse():
    cfg = parse_config(BASE + '[metrics]\nlisten = "[::1]:9187"\nlag_warning_seconds = 60\n')
    assert cfg.metrics.listen == "[::1]:9187" and cfg.metrics.lag_warning_seconds == 60
