"""The ``[ha]`` config and the leadership ``Lease`` (router/delivery/ha.py): times are given, no
clock."""

from __future__ import annotations

import pytest

from router.config.router import parse_config
from router.errors import ConfigError
from router.delivery.ha import HaConfig, Lease, control_topic, group_id, lease_seconds

BASE = """
[source]
dsn = "postgresql://postgres@127.0.0.1/postgres"
slot = "s1"
publications = ["p"]
[kafka]
bootstrap_servers = "127.0.0.1:9092"
[[routes]]
name = "r"
tables = ["public.t"]
"""


def test_defaults_names_and_lease_length():
    cfg = parse_config(BASE + "[ha]\nenabled = true\n")
    assert cfg.ha.enabled and cfg.ha.session_timeout_ms == 6000
    assert control_topic(cfg.ha, "s1") == "pgrouter.s1.leader"
    assert group_id(cfg.ha, "s1") == "pgrouter.s1"
    assert lease_seconds(cfg.ha) == 4.0  # session minus two heartbeat intervals
    assert not parse_config(BASE).ha.enabled  # single routers are unchanged


@pytest.mark.parametrize("line, path", [
    ("session_timeout_ms = 500", "ha.session_timeout_ms"),
    ("heartbeat_interval_ms = 3000", "ha.heartbeat_interval_ms"),
    ("max_poll_interval_ms = 1000", "ha.max_poll_interval_ms"),
    ("fence_delay_ms = -1", "ha.fence_delay_ms"),
    ('topic = "a b"', "ha.topic"),
    ("sesion_timeout_ms = 1", "ha"),
])
def test_bad_settings_name_their_key(line, path):
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        parse_config(BASE + f"[ha]\n{line}\n")


def test_lease_is_granted_renewed_and_lost():
    lease = Lease(4.0)
    assert not lease.holds(0.0) and not lease.expired(0.0)
    lease.grant(10.0)
    assert lease.term == 1 and lease.holds(13.9) and not lease.holds(14.0)
    lease.renew(13.0)  # a poll that started in time moves the deadline
    assert lease.holds(16.9) and not lease.holds(17.0)
    lease.grant(15.0)  # a second assignment callback does not start a new term
    assert lease.term == 1 and not lease.holds(17.0)
    lease.revoke()
    assert not lease.holds(11.0) and not lease.expired(100.0)


def test_a_frozen_process_cannot_renew_after_waking():
    """A poll that began before the freeze and returns after it, and every poll after the
    deadline, leave the lease expired: the process knows before Kafka tells it."""
    lease = Lease(4.0)
    lease.grant(0.0)
    lease.renew(1.0)  # the poll running when SIGSTOP came: deadline 5.0
    assert lease.expired(20.0) and not lease.holds(20.0)
    lease.renew(20.0)  # the first poll after waking
    assert not lease.holds(20.1) and lease.expired(20.1)
    lease.revoke()
    lease.grant(30.0)  # joined again: a new term
    assert lease.term == 2 and lease.holds(30.1)


def test_defaults_match_the_struct():
    assert HaConfig().fence_delay_ms == 2000 and HaConfig().heartbeat_interval_ms == 1000
