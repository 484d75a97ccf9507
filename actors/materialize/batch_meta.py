"""What a micro-batch holds, summed up per table layout before it is merged (``merge``): the
columns of its parsed (or decoded) records that matter, and one row per (route, schema,
table, schema_id, registry id) with its unchanged-TOAST columns, latest truncate, lowest
commit LSN and first undecodable record.
"""

from __future__ import annotations

from . import avro
from .columns import CORRUPT


def meta_columns(frame):
    """The columns of parsed (or decoded) records that ``summary`` sums up, one row per
    unchanged-TOAST name."""
    from pyspark.sql import functions as F

    return frame.select("source.route", "source.schema", "source.table", "source.schema_id",
                        "op", "source.commit_lsn", "source.seq", "_pgr_at", CORRUPT,
                        F.col("before").isNotNull().alias("has_before"),
                        F.explode_outer("unchanged_toast").alias("toast"),
                        F.col(avro.RID).alias("rid"))


def summary(columns):
    """Per (route, schema, table, schema_id, registry id) of the batch: unchanged-TOAST columns,
    the latest truncate, the lowest commit LSN, whether an update has a before image, the first
    record that did not parse and the first record's position (``at``). The Avro records of
    ``Materializer._parse`` are one group per registry id (``rid``), undecoded: their table is
    not known yet."""
    from pyspark.sql import functions as F

    return (columns.groupBy("route", "schema", "table", "schema_id", "rid")
            .agg(F.collect_set("toast").alias("toast"),
                 F.max(F.when(F.col("op") == "t", F.struct("commit_lsn", "seq")))
                 .alias("truncate"), F.min("commit_lsn").alias("lo"),
                 F.max((F.col("op") == "u") & F.col("has_before")).alias("before"),
                 F.min(F.when(F.col(CORRUPT).isNotNull(),
                              F.struct("_pgr_at", F.substring(CORRUPT, 1, 300))))
                 .alias("corrupt"), F.min("_pgr_at").alias("at"))
            .collect())
