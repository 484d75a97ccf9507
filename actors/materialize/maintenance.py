"""Table maintenance of the materializer: tombstones past their retention removed, optional
OPTIMIZE and VACUUM of the Delta tables, run after a micro-batch at most every
``[delta] maintenance_interval``.

Rules: a tombstone (``_pgr_deleted``) remembers in ``_pgr_deleted_at`` the commit time of its
delete; with ``tombstone_retention`` set, tombstones whose delete committed longer ago than the
retention are deleted, so a late record older than its row's delete is refused only while the
tombstone is kept (README "Table maintenance"). Tombstones written before ``_pgr_deleted_at``
existed (NULL) are kept. Only tables this job has written since it started are maintained.
Maintenance never carries the batch's ``txnAppId``: every step is idempotent.

Iceberg tables (``[output] format = "iceberg"``) are written merge-on-read, so compaction is
part of their upkeep, at most every ``[iceberg] compact_interval`` (``compact``; also
``pgrouter materialize --compact``): data files with deletes rewritten without them
(``rewrite_data_files``, small files binpacked, delete files of data files gone since, as
after a TRUNCATE, dropped), delete files no data file needs any more removed
(``rewrite_position_delete_files``), then snapshots older than
``[iceberg] snapshot_retention`` expired (the current one is always kept) and their files
deleted; the table property ``pgrouter.last-compaction`` says when (``iceberg.table_stats``).
``optimize`` and ``vacuum_retention`` are Delta's and do nothing on Iceberg tables.
"""

from __future__ import annotations

import datetime as dt
import time

from .columns import quote
from .settings import ICEBERG, STATE, JobConfig, duration_seconds


class Maintenance:
    def __init__(self, spark, cfg: JobConfig, *, clock=time.monotonic):
        self.spark, self.cfg, self.clock = spark, cfg, clock
        self.iceberg = cfg.output_format == ICEBERG
        self.compact_every = (None if not self.iceberg or cfg.compact_interval is None else
                              duration_seconds(cfg.compact_interval, path="iceberg.compact_interval"))
        self.keep_snapshots = duration_seconds(cfg.snapshot_retention,
                                               path="iceberg.snapshot_retention")
        self.ref = (lambda path: path) if self.iceberg else (lambda path: f"delta.{quote(path)}")
        self.interval = duration_seconds(cfg.maintenance_interval, path="delta.maintenance_interval")
        self.retention = (None if cfg.tombstone_retention is None else
                          duration_seconds(cfg.tombstone_retention, path="delta.tombstone_retention"))
        self.vacuum_hours = (None if cfg.vacuum_retention is None else
                             duration_seconds(cfg.vacuum_retention, path="delta.vacuum_retention")
                             / 3600)
        self.last = clock()

        self.last_compact = clock()

    @property
    def enabled(self) -> bool:
        return (self.retention is not None and self.cfg.mode == STATE) or (
            not self.iceberg and (self.cfg.optimize or self.vacuum_hours is not None))

    def due(self) -> bool:
        return (self.enabled and self.clock() - self.last >= self.interval) or (
            self.compact_every is not None
            and self.clock() - self.last_compact >= self.compact_every)

    def run(self, paths) -> None:
        paths = sorted(paths)
        if self.enabled and self.clock() - self.last >= self.interval:
            for path in paths:
                self.table(path)
            self.last = self.clock()
        if self.compact_every is not None and self.clock() - self.last_compact >= self.compact_every:
            for path in paths:
                self.compact(path)
            self.last_compact = self.clock()

    def compact(self, ref: str) -> None:
        """An Iceberg table's compaction (the module's docstring)."""
        catalog = ref.split(".", 1)[0]
        # the catalog named in the argument too: a route named like the catalog would be
        # taken for it
        arg = ref.replace("\\", "\\\\").replace("'", "\\'")
        self.spark.sql(f"CALL {catalog}.system.rewrite_data_files(table => '{arg}', "
                       "options => map('delete-file-threshold', '1', 'min-input-files', '2', "
                       # delete files of data files a TRUNCATE removed stay otherwise
                       "'remove-dangling-deletes', 'true'))")
        self.spark.sql(f"CALL {catalog}.system.rewrite_position_delete_files(table => '{arg}')")
        cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=self.keep_snapshots)
        self.spark.sql(f"CALL {catalog}.system.expire_snapshots(table => '{arg}', older_than => "
                       f"TIMESTAMP '{cutoff.strftime('%Y-%m-%d %H:%M:%S.%f')}+00:00', "
                       "retain_last => 1)")
        from .iceberg import COMPACTED_PROPERTY
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.spark.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES ('{COMPACTED_PROPERTY}' = '{now}')")

    def table(self, path: str) -> None:
        t = self.ref(path)
        if self.retention is not None and self.cfg.mode == STATE:
            cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=self.retention)
            self.spark.sql(f"DELETE FROM {t} WHERE _pgr_deleted AND _pgr_deleted_at < "
                           f"TIMESTAMP '{cutoff.strftime('%Y-%m-%d %H:%M:%S.%f')}+00:00'")
        if self.iceberg:
            return
        if self.cfg.optimize:
            self.spark.sql(f"OPTIMIZE {t}")
        if self.vacuum_hours is not None:
            self.spark.sql(f"VACUUM {t} RETAIN {self.vacuum_hours:g} HOURS")
