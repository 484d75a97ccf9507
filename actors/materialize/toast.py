"""Unchanged-TOAST columns in state mode: PostgreSQL leaves a large value out of an update
that did not change it (``unchanged_toast`` names it), so its value is the row's previous one.

Rules: within a micro-batch the key's last earlier value is carried forward (``fill_toast``);
names still unfilled stay in ``_pgr_toast`` and the MERGE keeps the stored value. A
key-changing update takes the values of its *old* key (``moved_toast``): the old key's last
value in the batch, else the old key's stored row; the new key's earlier values never apply.
"""

from __future__ import annotations


def fill_toast(rows, keys, toast, order):
    """An unchanged-TOAST value is the key's previous value: the last one in this batch if
    there is one (carried forward); names still unfilled stay in ``_pgr_toast`` and take
    the stored value in the MERGE."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = (Window.partitionBy(*keys).orderBy(*order)
         .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    filled = {}
    for c in toast:
        given = F.when(~F.array_contains("_pgr_toast", c), F.struct(F.col(c).alias("v")))
        filled[c] = F.last(given, ignorenulls=True).over(w)
    return rows.select(*[filled[c].getField("v").alias(c) if c in filled else F.col(c)
                         for c in rows.columns if c != "_pgr_toast"],
                       F.array_compact(F.array(*[F.when(filled[c].isNull(), F.lit(c))
                                                 for c in filled])).alias("_pgr_toast"))


def moved_toast(stored, rows, filled, keys, toast):
    """``rows`` with the unchanged-TOAST columns of each key-changing update (``_pgr_move =
    'to'``) taken from its old key: the old key's last value in the batch before the move
    (its ``from`` row in ``filled``), else the old key's row in ``stored`` (the table)."""
    from pyspark.sql import functions as F

    mv = [f"_pgr_mv{i}" for i in range(len(toast))]
    stored = (stored.filter("NOT _pgr_deleted")
              .select(*keys, *[F.col(c).alias(f"_pgr_st{i}") for i, c in enumerate(toast)]))
    src = (filled.filter(F.col("_pgr_move") == "from").join(stored, list(keys), "left")
           .select(F.col("_pgr_commit_lsn").alias("_pgr_mv_lsn"),
                   F.col("_pgr_seq").alias("_pgr_mv_seq"),
                   *[F.when(F.array_contains("_pgr_toast", c), F.col(f"_pgr_st{i}"))
                     .otherwise(F.col(c)).alias(mv[i]) for i, c in enumerate(toast)]))
    to = F.col("_pgr_move") == "to"
    joined = rows.join(src, to & (F.col("_pgr_commit_lsn") == F.col("_pgr_mv_lsn"))
                       & (F.col("_pgr_seq") == F.col("_pgr_mv_seq")), "left")
    out = [F.when(to & F.array_contains("_pgr_toast", c), F.col(mv[toast.index(c)]))
           .otherwise(F.col(c)).alias(c) if c in toast else F.col(c)
           for c in rows.columns if c != "_pgr_toast"]
    left = F.when(F.coalesce(to, F.lit(False)), F.array().cast("array<string>")) \
        .otherwise(F.col("_pgr_toast"))
    return joined.select(*out, left.alias("_pgr_toast"))
