"""The ``Leadership`` actor: which of several ``pgrouter run`` processes streams the slot.

Rules (the group and the lease are ``router.delivery.ha``'s; docs/ha.md tells the operator):

* A librdkafka consumer in its own thread joins the group ``group_id`` on the one-partition
  control topic (created when missing) with the ``cooperative-sticky`` assignor, so a standby
  joining or leaving never takes partition 0 away from the leader. Heartbeats run in
  librdkafka's background thread; the thread here polls ten times a second (which serves
  ``max.poll.interval.ms`` and the rebalance callbacks) and renews the ``Lease``.
* The trio side (``serve``) is standby (``/readyz``: 503 ``standby``) until the lease is
  granted, then runs the pipeline (``body``) in a scope that is cancelled as soon as
  ``holds()`` turns false. Besides that, the slot reader asks ``holds()`` before every
  standby status update (a confirmation) and the sink before every hand-over of records and
  every Kafka transaction commit: once the lease has expired nothing more is confirmed or
  produced, also in the moments after a frozen process wakes and before any task noticed.
  After a loss the consumer leaves and joins again as a new member (a new term).
* A new leader that finds the slot held by another process (a frozen predecessor whose
  walsender PostgreSQL still keeps) waits ``fence_delay_ms`` and then terminates that
  walsender, instead of waiting for ``wal_sender_timeout``, and terminates it again every
  ``FENCE_AGAIN`` seconds while it still holds the slot: a walsender that was sending to the
  frozen process's full socket handles the first terminate by writing its error to that
  socket, and blocks there (``ClientWrite``) until a second one; it never terminates a
  process that took the slot after it looked. The pipeline waits for the slot as long as
  this process leads (``runner.source``; a busy slot never stops a leader) and continues from
  its confirmed position.
* With ``[ha]`` the Kafka producer has the group's transactional id, so a new leader's
  producer fences the old one in Kafka (``actors.kafka.fencing``, ``actors.kafka.transactional``):
  what a woken leader's client still queued is refused.
* When the pipeline returns (SIGTERM drained it, or ``--until-caught-up``), the consumer
  leaves the group at once, so a standby takes over without waiting for the session timeout.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Awaitable, Callable

import trio

from router.errors import ConfigError, LeadershipLost, PgRouterError, SlotInUse
from router.delivery.exactly_once import ProducerFenced
from router.delivery.ha import Lease, control_topic, group_id, lease_seconds

from ..services import log, slots
from ..services.sql import SqlSession

_log = log.get("ha")
POLL = 0.1  # seconds a poll of the group consumer waits
WATCH = 0.05  # seconds between the trio side's looks at the lease
FENCE_POLL = 0.2  # seconds between looks at the slot's holder while fencing
LEAVE_TIMEOUT = 15.0  # seconds leaving the group may take at the end
RETRY = 2.0  # seconds before the group consumer is made again after a failure
FENCE_AGAIN = 1.0  # seconds between terminates of a walsender that still holds the slot
FENCE_LOG = 10.0  # seconds between the lines of a fence that goes on


def _now() -> float:
    """The lease's clock: CLOCK_BOOTTIME where there is one, which also runs while the
    machine is suspended (CLOCK_MONOTONIC stops then, so a resumed VM's lease would still
    look valid); else the monotonic clock."""
    return time.clock_gettime(_CLOCK)


_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def consumer_conf(cfg, slot: str, client_id: str) -> dict:
    """librdkafka settings of the group consumer of ``slot``'s routers: the producer's
    connection and security settings, and the ``[ha]`` timings."""
    from ..kafka.admin import connection_conf

    ha = cfg.ha
    conf = connection_conf(cfg.kafka.bootstrap_servers, dict(cfg.kafka.settings))
    conf.update({
        "group.id": group_id(ha, slot), "client.id": client_id,
        "session.timeout.ms": ha.session_timeout_ms,
        "heartbeat.interval.ms": ha.heartbeat_interval_ms,
        "max.poll.interval.ms": ha.max_poll_interval_ms,
        "partition.assignment.strategy": "cooperative-sticky",
        "enable.auto.commit": False, "auto.offset.reset": "latest",
        "allow.auto.create.topics": False,
    })
    return conf


def ensure_control_topic(cfg, slot: str, conf: dict) -> None:
    """Create the control topic with one partition; an existing one must have exactly one."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = control_topic(cfg.ha, slot)
    admin = AdminClient({k: v for k, v in conf.items()
                         if k in ("bootstrap.servers", "logger") or k.startswith(
                             ("security.", "sasl.", "ssl.", "socket.", "request.timeout"))})
    meta = admin.list_topics(timeout=10)
    found = meta.topics.get(topic)
    if found is not None and found.error is None:
        if len(found.partitions) != 1:
            raise ConfigError(f"the control topic {topic} has {len(found.partitions)} "
                              "partitions; leadership needs exactly one", path="ha.topic")
        return
    rf = max((r.topic_settings.replication_factor for r in cfg.routes), default=1)
    fut = admin.create_topics([NewTopic(topic, 1, rf)])[topic]
    try:
        fut.result(10)
    except KafkaException as exc:  # made meanwhile by another router is fine
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


class Leadership:
    def __init__(self, cfg, slot: str, health=None):
        """Leadership of the routers of ``slot`` (the start's ``Source.slot``)."""
        try:
            import confluent_kafka  # noqa: F401
        except ImportError as exc:
            raise ConfigError("leadership needs confluent-kafka: install pgrouter with its "
                              "librdkafka extra (pip install '.[librdkafka]')",
                              path="ha.enabled") from exc
        self.cfg, self.slot = cfg, slot
        self.topic = control_topic(cfg.ha, slot)
        self.group = group_id(cfg.ha, slot)
        self.lease = Lease(lease_seconds(cfg.ha))
        self.client_id = f"pgrouter-{socket.gethostname()}-{os.getpid()}"
        self.member_id: str | None = None
        self.role = "standby"
        self.health = health
        self._conf = consumer_conf(cfg, slot, self.client_id)
        self._stop = threading.Event()
        self._owned = False
        self._fencing = False  # a fence task runs
        self._thread: threading.Thread | None = None
        self.failure: ConfigError | None = None  # the thread's, raised by ``serve``

    def holds(self) -> bool:
        """May this process stream, produce and confirm right now (its lease is valid)?"""
        return self.lease.holds(_now())

    def describe(self) -> dict:
        """For ``/api/status``: this process's place in the group."""
        return {"group": self.group, "topic": self.topic, "role": self.role,
                "client_id": self.client_id, "member_id": self.member_id,
                "term": self.lease.term}

    # -- the group consumer's thread ------------------------------------------------------

    def _main(self) -> None:
        from confluent_kafka import Consumer

        while not self._stop.is_set():
            try:
                ensure_control_topic(self.cfg, self.slot, self._conf)
                consumer = Consumer(self._conf)
            except ConfigError as exc:
                self.failure = exc
                return
            except Exception as exc:  # noqa: BLE001 — Kafka away: stay standby, try again
                log.event(_log, "cannot join the leadership group yet", level=logging.WARNING,
                          group=self.group, error=str(exc))
                self._stop.wait(RETRY)
                continue
            try:
                self._member(consumer)
            except Exception as exc:  # noqa: BLE001 — the same: leave, try again
                log.event(_log, "leadership group consumer failed", level=logging.WARNING,
                          group=self.group, error=str(exc))
                self._stop.wait(RETRY)
            finally:
                self._owned = False
                self.lease.revoke()
                try:
                    consumer.close()  # leaves the group: the others rebalance at once
                except Exception:  # noqa: BLE001 — a session that expired already
                    pass

    def _member(self, consumer) -> None:
        def assigned(c, parts):
            if any(p.topic == self.topic and p.partition == 0 for p in parts):
                self.member_id = c.memberid()
                self._owned = True
                self.lease.grant(_now())

        def taken(c, parts):
            if any(p.topic == self.topic and p.partition == 0 for p in parts):
                self._owned = False
                self.lease.revoke()

        consumer.subscribe([self.topic], on_assign=assigned, on_revoke=taken, on_lost=taken)
        lease = self.lease
        while not self._stop.is_set():
            started = _now()
            consumer.poll(POLL)
            if self.member_id is None or not self._owned:
                self.member_id = consumer.memberid()
            if self._owned:
                lease.renew(started)
                if lease.expired(_now()):
                    log.event(_log, "leadership lease expired (this process was not running "
                              "for longer than the session allows)", level=logging.WARNING,
                              group=self.group)
                    return

    # -- the trio side ----------------------------------------------------------------------

    async def serve(self, body: Callable[[], Awaitable[None]], drain: trio.Event) -> None:
        """Standby until leading, then ``body`` until it returns (drained: leave the group)
        or leadership is lost (standby again). Returns when drained."""
        self._thread = threading.Thread(target=self._main, name="pgrouter-ha", daemon=True)
        self._thread.start()
        log.event(_log, "joining the leadership group", group=self.group, topic=self.topic,
                  client_id=self.client_id)
        try:
            while True:
                self._standby()
                while not self.holds():
                    with trio.move_on_after(WATCH):
                        await drain.wait()
                    if drain.is_set():
                        return
                    if self.failure is not None:
                        raise self.failure
                self.role = "leader"
                term = self.lease.term
                log.event(_log, "leading: this router streams the slot", group=self.group,
                          term=term, member_id=self.member_id)
                if await self._lead(body):
                    return
                # librdkafka joins again by itself after a revocation; after an expired
                # lease the group thread leaves and joins as a new member
                log.event(_log, "leadership lost: streaming stopped, nothing more is produced "
                          "or confirmed; standing by", level=logging.WARNING, group=self.group,
                          term=term)
        finally:
            self.role = "leaving"
            self._stop.set()
            with trio.move_on_after(LEAVE_TIMEOUT) as scope:
                scope.shield = True
                await trio.to_thread.run_sync(self._thread.join, LEAVE_TIMEOUT)
            log.event(_log, "left the leadership group", group=self.group)

    def _standby(self) -> None:
        self.role = "standby"
        if self.health is not None:
            self.health.set(False, "standby")

    async def _lead(self, body) -> bool:
        """True when ``body`` returned (drained or caught up), False when leadership ended."""
        finished = False  # also when the watch cancels the stream
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch, nursery.cancel_scope)
            finished = await self._stream(body, nursery)
            nursery.cancel_scope.cancel()
        return finished

    async def _stream(self, body, nursery) -> bool:
        while True:
            if not self._fencing:
                self._fencing = True
                nursery.start_soon(self._fence)
            try:
                await body()
                return True
            except SlotInUse as exc:
                # a leader never gives up on a busy slot (nobody would stream): it fences
                # the holder and starts again
                if not self.holds():
                    return False
                log.event(_log, "leading, but the slot is in use: fencing its holder and "
                          "starting again", level=logging.WARNING, error=str(exc))
                await trio.sleep(RETRY)
            except ProducerFenced as exc:
                if not self.holds():  # a woken former leader: the new one fenced it
                    return False
                # fenced while this group's lease holds: a producer outside the group took
                # the transactional id (exactly-once's hint would mislead here)
                raise ProducerFenced(
                    f"fenced: a router outside [ha] group {self.group!r} (another [ha] group "
                    f"or topic, or a router without [ha]) registered this slot's Kafka "
                    f"transactional id while this one led; this one stops (give every "
                    f"router of the slot the same [ha] group)") from exc
            except PgRouterError as exc:
                # losing the lease fails the sink or the reader with LeadershipLost (or
                # what it broke); anything else while leading stops the router
                if self.holds() and not isinstance(exc, LeadershipLost):
                    raise
                return False

    async def _watch(self, scope: trio.CancelScope) -> None:
        while self.holds():
            await trio.sleep(WATCH)
        scope.cancel()

    async def _fence(self) -> None:
        """Terminate the walsender of a predecessor that still holds the slot after the
        fence delay, and again while it holds it (one that let go, or a holder that changed,
        is left alone)."""
        slot, delay = self.slot, self.cfg.ha.fence_delay_ms / 1000
        start = trio.current_time()
        try:
            async with await SqlSession.connect(self.cfg.source.dsn) as sql:
                holder = await slots.active_pid(sql, slot)
                if holder is None:
                    return
                log.event(_log, "the slot is still held by another process: fencing it",
                          slot=slot, active_pid=holder, fence_delay_s=delay)
                while trio.current_time() - start < delay:
                    await trio.sleep(FENCE_POLL)
                    if await slots.active_pid(sql, slot) != holder:
                        return
                await self._terminate(sql, holder)
        except PgRouterError as exc:  # the pipeline's own wait for the slot reports it
            log.event(_log, "could not fence the slot's holder", level=logging.WARNING,
                      slot=slot, error=str(exc))
        finally:
            self._fencing = False

    async def _terminate(self, sql: SqlSession, holder: int) -> None:
        """``pg_terminate_backend`` of ``holder`` every ``FENCE_AGAIN`` seconds until it no
        longer holds the slot."""
        slot, times, said = self.slot, 0, trio.current_time()
        while await slots.terminate(sql, slot, holder):
            times += 1
            if times == 1:
                log.event(_log, "terminated the previous holder's walsender", slot=slot,
                          pid=holder)
            elif times == 2 or trio.current_time() - said >= FENCE_LOG:
                said = trio.current_time()
                log.event(_log, "the previous holder's walsender still holds the slot: "
                          "terminated again", level=logging.WARNING, slot=slot, pid=holder,
                          times=times)
            await trio.sleep(FENCE_AGAIN)
