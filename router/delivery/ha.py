"""High availability: several ``pgrouter run`` processes on one config, one of them active.

Leadership is Kafka's: every router joins a consumer group (``group_id``) on a control topic
with ONE partition (``control_topic``); the member that owns partition 0 is the leader. The
coordinator's session timeout, heartbeats and rebalances decide who that is. This module
holds what is pure about it: the ``[ha]`` config and the ``Lease``.

Rules of the ``Lease`` (what the process itself may assume, judged by its own clock, which
also runs while the machine is suspended (CLOCK_BOOTTIME), so a process that was frozen knows
it lost leadership *before* Kafka tells it):

* Granted when partition 0 is assigned; it then lasts ``lease_seconds`` = session timeout
  minus two heartbeat intervals (the coordinator expires a member ``session_timeout`` after
  the last heartbeat it received, which was at most one interval before the last poll).
* Renewed by every poll of the group consumer that *started* while the lease was valid and
  returned with the partition still assigned: a poll that began before a freeze and returns
  after it cannot renew past the old deadline.
* Once expired or revoked it is never renewed: the process stops streaming, leaves, and
  joins again as a new member (a new term).
"""

from __future__ import annotations

import msgspec

from ..errors import ConfigError


class HaConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[ha]``: standby routers coordinated by Kafka's group coordinator (docs/ha.md)."""

    #: several routers on this config: one streams, the others wait as standbys
    enabled: bool = False
    #: the control topic (one partition; its owner leads); "" = "pgrouter.<slot>.leader"
    topic: str = ""
    #: the consumer group; "" = "pgrouter.<slot>"
    group: str = ""
    #: Kafka's session timeout: a leader not heard from for this long is replaced (the
    #: broker's group.min.session.timeout.ms, 6000 by default, is the lowest it accepts)
    session_timeout_ms: int = 6000
    #: heartbeats to the group coordinator (librdkafka sends them from its own thread)
    heartbeat_interval_ms: int = 1000
    #: max.poll.interval.ms of the group consumer (its thread polls ten times a second)
    max_poll_interval_ms: int = 30000
    #: a new leader that finds the slot still held waits this long after its assignment,
    #: then terminates the holder's walsender (``pg_terminate_backend``)
    fence_delay_ms: int = 2000


def control_topic(ha: HaConfig, slot: str) -> str:
    return ha.topic or f"pgrouter.{slot}.leader"


def group_id(ha: HaConfig, slot: str) -> str:
    return ha.group or f"pgrouter.{slot}"


def lease_seconds(ha: HaConfig) -> float:
    return (ha.session_timeout_ms - 2 * ha.heartbeat_interval_ms) / 1000


def validate_ha(ha: HaConfig, *, source: str) -> None:
    if ha.session_timeout_ms < 1000:
        raise ConfigError("must be at least 1000 ms", path="ha.session_timeout_ms",
                          source=source)
    if ha.heartbeat_interval_ms < 100 or 3 * ha.heartbeat_interval_ms > ha.session_timeout_ms:
        raise ConfigError("must be at least 100 ms and at most a third of "
                          "ha.session_timeout_ms", path="ha.heartbeat_interval_ms",
                          source=source)
    if ha.max_poll_interval_ms < ha.session_timeout_ms:
        raise ConfigError("must be at least ha.session_timeout_ms",
                          path="ha.max_poll_interval_ms", source=source)
    if ha.fence_delay_ms < 0:
        raise ConfigError("must be >= 0", path="ha.fence_delay_ms", source=source)
    for key in ("topic", "group"):
        value = getattr(ha, key)
        if value and not all(c.isalnum() or c in "._-" for c in value):
            raise ConfigError("letters, digits, '.', '_' and '-' only", path=f"ha.{key}",
                              source=source)


class Lease:
    """Leadership as this process may assume it (rules in the module docstring). Times are
    monotonic seconds given by the caller; written by the group consumer's thread, read by
    the trio thread (single attribute reads and writes)."""

    def __init__(self, length: float):
        self.length = length
        self.term = 0
        self._until: float | None = None

    def grant(self, now: float) -> None:
        if self._until is None:
            self.term += 1
            self._until = now + self.length

    def renew(self, started: float) -> None:
        until = self._until
        if until is not None and started < until:
            self._until = max(until, started + self.length)

    def revoke(self) -> None:
        self._until = None

    def holds(self, now: float) -> bool:
        until = self._until
        return until is not None and now < until

    def expired(self, now: float) -> bool:
        """Granted, then not renewed in time (the process must leave and rejoin)."""
        until = self._until
        return until is not None and now >= until
