"""The slot monitor: the replication slot sampled over SQL while the pipeline streams.

Rules:

* Every ``[metrics] sample_interval`` seconds one query reads the server's WAL position and
  the slot's confirmed flush LSN, restart LSN, ``wal_status`` and ``safe_wal_size``: the lag
  in bytes and the WAL the slot retains are the server's own figures, not the router's.
* Above ``lag_warning_bytes`` / ``lag_warning_seconds`` a warning line is logged when the lag
  crosses the threshold and every ``WARN_EVERY`` seconds while it stays above, and
  ``pgrouter_slot_lag_warning`` is 1.
* A slot the server invalidated (``wal_status = lost``) stops the router with
  ``SlotInvalidated``: streaming it again cannot recover what the server removed.
* A failed sample (the SQL connection lost) is logged and retried at the next interval; it
  never stops the stream, which has its own connection.
"""

from __future__ import annotations

import time
from typing import Callable

import msgspec
import trio

from router.errors import SlotInvalidated, SourceError
from router.postgres.lsn import format_lsn, parse_lsn

from ..services import log
from ..services import slots
from ..services.sql import SqlSession

_log = log.get("slot_monitor")
WARN_EVERY = 60.0



class SlotSample(msgspec.Struct, frozen=True):
    current: int
    confirmed: int
    restart: int | None
    wal_status: str | None
    safe_wal_size: int | None
    active: bool

    @property
    def lag_bytes(self) -> int:
        return max(0, self.current - self.confirmed) if self.confirmed else 0

    @property
    def retained_bytes(self) -> int | None:
        return max(0, self.current - self.restart) if self.restart is not None else None


async def sample_slot(sql: SqlSession, slot: str) -> SlotSample | None:
    r = await slots.sample(sql, slot)
    if r is None:
        return None
    return SlotSample(current=parse_lsn(r["current"]),
                      confirmed=parse_lsn(r["confirmed"]) if r["confirmed"] else 0,
                      restart=parse_lsn(r["restart"]) if r["restart"] else None,
                      wal_status=r["wal_status"], safe_wal_size=r["safe_wal_size"],
                      active=bool(r["active"]))


def refuse_invalidated(slot: str, sample: SlotSample | None) -> None:
    if sample is not None and sample.wal_status == "lost":
        raise SlotInvalidated(
            f"replication slot {slot!r} was invalidated by the server (wal_status=lost): it "
            f"removed WAL the slot still needed (see max_slot_wal_keep_size); the changes "
            f"after {format_lsn(sample.confirmed)} are gone. Drop the slot, create it again "
            "and re-snapshot the routes' tables")


class SlotMonitor:
    def __init__(self, *, dsn: str, slot: str, interval: float, metrics=None,
                 warn_bytes: int = 0, warn_seconds: float = 0.0,
                 lag_seconds: Callable[[], float] | None = None):
        self.dsn = dsn
        self.slot = slot
        self.interval = interval
        self.metrics = metrics
        self.warn_bytes = warn_bytes
        self.warn_seconds = warn_seconds
        self.lag_seconds = lag_seconds or (lambda: 0.0)
        self._warned_at: float | None = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        sql: SqlSession | None = None
        try:
            while True:
                try:
                    if sql is None:
                        sql = await SqlSession.connect(self.dsn)
                    sample = await sample_slot(sql, self.slot)
                except SourceError as exc:
                    log.event(_log, "slot sample failed, retrying", error=str(exc),
                              retry_in_s=self.interval)
                    if sql is not None:
                        await sql.close()
                    sql = None
                else:
                    refuse_invalidated(self.slot, sample)
                    if sample is not None:
                        self._observe(sample)
                await trio.sleep(self.interval)
        finally:
            if sql is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await sql.close()

    def _observe(self, sample: SlotSample) -> None:
        lag_s = self.lag_seconds()
        over = ((self.warn_bytes and sample.lag_bytes > self.warn_bytes)
                or (self.warn_seconds and lag_s > self.warn_seconds))
        now = time.monotonic()
        if over and (self._warned_at is None or now - self._warned_at >= WARN_EVERY):
            self._warned_at = now
            log.event(_log, "slot lag above the warning threshold", slot=self.slot,
                      lag_bytes=sample.lag_bytes, lag_s=round(lag_s, 1),
                      retained_wal_bytes=sample.retained_bytes, wal_status=sample.wal_status,
                      safe_wal_bytes=sample.safe_wal_size,
                      warning_bytes=self.warn_bytes or None,
                      warning_s=self.warn_seconds or None)
        elif not over and self._warned_at is not None:
            self._warned_at = None
            log.event(_log, "slot lag back below the warning threshold", slot=self.slot,
                      lag_bytes=sample.lag_bytes)
        if self.metrics is not None:
            self.metrics.sampled_slot(lag_bytes=sample.lag_bytes,
                                      retained_bytes=sample.retained_bytes,
                                      safe_bytes=sample.safe_wal_size,
                                      wal_status=sample.wal_status, warning=bool(over),
                                      active=sample.active, lag_seconds=lag_s,
                                      confirmed_lsn=format_lsn(sample.confirmed),
                                      server_lsn=format_lsn(sample.current))
