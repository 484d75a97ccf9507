"""Table maintenance of the materializer: tombstones past their retention removed, optional
OPTIMIZE and VACUUM of the Delta tables, run after a micro-batch at most every
``[delta] maintenance_interval``.

Rules: a tombstone (``_pgr_deleted``) remembers in ``_pgr_deleted_at`` the commit time of its
delete; with ``tombstone_retention`` set, tombstones whose delete committed longer ago than the
retention are deleted, so a late record older than its row's delete is refused only while the
tombstone is kept (README "Table maintenance"). Tombstones written before ``_pgr_deleted_at``
existed (NULL) are kept. Only tables this job has written since it started are maintained.
Maintenance never carries the batch's ``txnAppId``: every step is idempotent.
"""

from __future__ import annotations

import datetime as dt
import time

from .columns import quote
from .settings import STATE, JobConfig, duration_seconds


class Maintenance:
    def __init__(self, spark, cfg: JobConfig, *, clock=time.monotonic):
        self.spark, self.cfg, self.clock = spark, cfg, clock
        self.interval = duration_seconds(cfg.maintenance_interval, path="delta.maintenance_interval")
        self.retention = (None if cfg.tombstone_retention is None else
                          duration_seconds(cfg.tombstone_retention, path="delta.tombstone_retention"))
        self.vacuum_hours = (None if cfg.vacuum_retention is None else
                             duration_seconds(cfg.vacuum_retention, path="delta.vacuum_retention")
                             / 3600)
        self.last = clock()

    @property
    def enabled(self) -> bool:
        return (self.retention is not None and self.cfg.mode == STATE) or self.cfg.optimize \
            or self.vacuum_hours is not None

    def due(self) -> bool:
        return self.enabled and self.clock() - self.last >= self.interval

    def run(self, paths) -> None:
        for path in sorted(paths):
            self.table(path)
        self.last = self.clock()

    def table(self, path: str) -> None:
        t = f"delta.{quote(path)}"
        if self.retention is not None and self.cfg.mode == STATE:
            cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=self.retention)
            self.spark.sql(f"DELETE FROM {t} WHERE _pgr_deleted AND _pgr_deleted_at < "
                           f"TIMESTAMP '{cutoff.strftime('%Y-%m-%d %H:%M:%S.%f')}+00:00'")
        if self.cfg.optimize:
            self.spark.sql(f"OPTIMIZE {t}")
        if self.vacuum_hours is not None:
            self.spark.sql(f"VACUUM {t} RETAIN {self.vacuum_hours:g} HOURS")
