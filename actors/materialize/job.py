"""pgrouter materializer: Kafka topics written by pgrouter -> one Delta table per routed table.

A standalone Spark Structured Streaming job. It depends only on pyspark, delta-spark and the
message format (README "Message format"), never on PostgreSQL nor on ``router/`` (but its pure
array parser and error tree), so it runs under ``spark-submit`` on any cluster (with
``--py-files`` naming the bundle that ``make materialize-bundle`` writes; README "Spark
materializer").

Rules the job keeps:

* Column types come from the schema topic (``source.schema_id`` -> ``TableSchema``), read to its
  end by a Kafka consumer in the driver (``schema_topic``) whenever a micro-batch names a
  schema not seen yet. The router has every schema acknowledged before a record naming it, so
  reading the topic to its end finds it.
* Records are JSON or Avro (the router's ``format = "avro"``: a first byte 0x00), told apart
  record by record. Avro records are decoded in the JVM with their schema, fetched by the
  driver from ``[kafka.registry]`` by the id each names, into the same change rows with the
  same column types (``avro``); a key change's delete and create are one update again.
* Position = ``(source.commit_lsn, source.seq)``. Copies of one position are byte-identical, so
  dropping all but one is exact. Messages (``op: m``) are ignored.
* A record that is not a change record (not JSON, or a value not of its column's JSON type:
  integers and booleans are parsed as such, ``columns.image_fields``) stops the job before its
  micro-batch writes anything, naming its Kafka position: never skipped, never half read.
* ``state`` mode: per key only the change with the highest position in a micro-batch is merged,
  and a MERGE only overwrites a stored row whose position is lower. Deletes keep a tombstone
  (``_pgr_deleted = true``) with their position, so a late older change never resurrects a row.
  Readers filter ``NOT _pgr_deleted``. Unchanged-TOAST columns take the last value of the key in
  the batch, else the stored one. A key-changing update deletes the old key and upserts the new.
  A truncate at position P deletes every stored row older than P and is remembered in the table
  property ``pgrouter.truncated_before`` so later-arriving changes older than P are dropped;
  changes after P, in the same batch or later, apply.
* ``changelog`` mode: every position once, appended with ``_pgr_op`` and its position
  (insert-only MERGE on the position, so a re-sent record or a re-run batch adds nothing).
* Every write of a micro-batch to a table carries Delta's ``txnAppId``/``txnVersion`` (app id
  derived from the checkpoint location, version = batch id): a batch re-run after a crash is
  skipped by Delta where it already committed.
* Schema changes: new columns are added to the table; columns a newer schema lacks stay and
  are NULL in rows written since; a widening type change (``columns.widens``: int -> bigint,
  float -> double, a wider decimal…) widens the column in place (Delta type widening); any
  other type change, or a changed key, stops the job with ``MaterializeError``. State mode
  refuses tables without key columns.
* A key-changing update takes its unchanged-TOAST values from the old key (``toast``).
* Table maintenance (``maintenance``): tombstones past ``tombstone_retention`` removed,
  optional OPTIMIZE and VACUUM, after a micro-batch at most every ``maintenance_interval``.
* Tables live at ``<warehouse>/<route>/<schema>/<table>``; a table is created by the first
  write of its rows, data and properties in one commit (``tables``).

The job is split by responsibility: ``settings`` (the config), ``columns`` (types and values),
``merge`` (the streaming query and its writes), ``avro`` (Avro records), ``schema_topic``
(reading the schemas),
``tables`` (the Delta tables: creation, added and widened columns), ``toast`` (unchanged-TOAST
values), ``maintenance`` (table upkeep) and this module (the session and the entry point).
"""

from __future__ import annotations

import argparse
import os
import sys

from actors.materialize import class_archive
from actors.materialize.columns import parse_pg_array, quote, spark_type_name, table_path
from actors.materialize.merge import Materializer
from actors.materialize.settings import (CHANGELOG, ICEBERG, STATE, JobConfig,
                                         MaterializeError, config_from_dict, load_config, reason,
                                         validate)

__all__ = ["CHANGELOG", "ICEBERG", "STATE", "compact", "table_stats", "JobConfig",
           "MaterializeError", "Materializer", "build_session", "config_from_dict", "load_config", "main", "parse_pg_array", "quote", "run",
           "spark_type_name", "table_path", "validate"]

# --- session and entry point ---------------------------------------------------------------------

#: HotSpot's C2 compiles a method after 50,000 calls instead of 5,000 (README "Throughput"):
#: the records' hot loops still reach C2 within seconds, while the thousands of lukewarm
#: planner, Delta-log and code-generator methods of a micro-batch stay in C1 instead of taking
#: a core from the tasks. The parallel collector: a micro-batch is throughput work, and G1's
#: write barriers and concurrent threads cost 8-12% of the CPU of a drain. As
#: *default*JavaOptions, a user's extraJavaOptions apply after them.
JVM_OPTIONS = ("-XX:+UseParallelGC -XX:Tier4InvocationThreshold=50000 "
               "-XX:Tier4MinInvocationThreshold=20000 -XX:Tier4CompileThreshold=60000 "
               "-XX:Tier4BackEdgeThreshold=400000")

DEFAULT_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.databricks.delta.snapshotPartitions": "2",
    # Delta's VACUUM lists a table's files in this many tasks: Spark's default of 10,000 made a
    # VACUUM of a small table take 60-100 s on local[2] (8: 4-10 s)
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
    "spark.databricks.delta.write.txnVersion.autoReset.enabled": "false",
    # a micro-batch generates ~50 classes (the job's and Delta's MERGE); Spark's default cache
    # of 100 evicted them by the next batch, which compiled them all again
    "spark.sql.codegen.cache.maxEntries": "1000",
    "spark.driver.defaultJavaOptions": JVM_OPTIONS,
    "spark.executor.defaultJavaOptions": JVM_OPTIONS,
}
#: defaults that a cluster's own setting (spark-submit --conf, spark-defaults.conf) replaces
_IF_UNSET = {"spark.driver.defaultJavaOptions", "spark.executor.defaultJavaOptions"}


def session_conf(cfg: JobConfig, given) -> dict[str, str]:
    """The settings the job gives its session: ``DEFAULT_CONF`` (those in ``_IF_UNSET`` only
    where ``given``, what spark-submit set, lacks them), then ``[spark] conf`` and the jars."""
    conf = {k: v for k, v in DEFAULT_CONF.items() if k not in _IF_UNSET or not given.contains(k)}
    conf.update(cfg.spark_conf)
    if cfg.jars:
        conf["spark.jars"] = ",".join([*cfg.jars, *filter(None, [conf.get("spark.jars")])])
    return conf


def build_session(cfg: JobConfig, *, archive: bool = False):
    """The job's session. ``archive``: with ``[spark] class_archive`` set and the driver JVM
    started here, map or write the class-data archive (``class_archive``); the session then
    carries it as ``spark._pgrouter_archive`` for ``class_archive.finish``."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(cfg.app_name)
    given = SparkConf()  # what spark-submit (--conf, spark-defaults.conf) set
    if not given.contains("spark.master"):  # spark-submit --master wins
        builder = builder.master(cfg.master)
    conf = session_conf(cfg, given)
    plan = None
    if (archive and cfg.class_archive and SparkContext._gateway is None
            and "PYSPARK_GATEWAY_PORT" not in os.environ):  # the driver JVM starts here
        key = "spark.driver.defaultJavaOptions"
        options = " ".join(filter(None, [conf.get(key), conf.get("spark.driver.extraJavaOptions")]))
        jars = [j for j in conf.get("spark.jars", "").split(",") if j]
        plan = class_archive.plan(cfg.class_archive, jars, options)
        conf[key] = " ".join(filter(None, [conf.get(key), plan.options]))
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark._pgrouter_archive = plan
    return spark


def run(cfg: JobConfig, *, available_now: bool = False, spark=None,
        py_files: tuple[str, ...] = ()) -> None:
    """Run the job; ``py_files`` (the ``--py-files`` bundle) are shipped to the executors of
    a session started here, as ``spark-submit --py-files`` does. A session started here with a
    class-data archive to write is stopped at the end, so its JVM exits and writes it."""
    spark = spark or build_session(cfg, archive=True)
    for f in py_files:
        spark.sparkContext.addPyFile(f)
    Materializer(spark, cfg).run(available_now=available_now)
    class_archive.finish(getattr(spark, "_pgrouter_archive", None), spark)


def compact(cfg: JobConfig, *, spark=None) -> list[str]:
    """``--compact``: every Iceberg table of the catalog compacted now (``maintenance``), as
    the job does on its schedule; returns their names."""
    if cfg.output_format != ICEBERG:
        raise MaterializeError("--compact compacts Iceberg tables ([output] format = "
                               "\"iceberg\"); Delta tables: [delta] optimize = true")
    from actors.materialize.iceberg import all_tables
    from actors.materialize.maintenance import Maintenance

    spark = spark or build_session(cfg)
    tables = all_tables(spark, cfg)
    upkeep = Maintenance(spark, cfg)
    for ref in tables:
        try:
            upkeep.compact(ref)
        except Exception as exc:
            raise MaterializeError(f"{ref}: compaction failed: {reason(exc)}") from exc
    return tables


def table_stats(cfg: JobConfig, *, spark=None) -> list[tuple[str, dict]]:
    """``--tables``: every Iceberg table of the catalog with its rows, data files, delete files
    and last compaction (``iceberg.table_stats``)."""
    if cfg.output_format != ICEBERG:
        raise MaterializeError("--tables lists Iceberg tables ([output] format = \"iceberg\")")
    from actors.materialize import iceberg

    spark = spark or build_session(cfg)
    return [(ref, iceberg.table_stats(spark, ref)) for ref in iceberg.all_tables(spark, cfg)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="materialize pgrouter topics into Delta tables")
    ap.add_argument("--config", "-c", required=True, help="materialize TOML config")
    ap.add_argument("--available-now", action="store_true",
                    help="process what is in Kafka now, then exit")
    ap.add_argument("--compact", action="store_true",
                    help="compact every Iceberg table of the catalog now, then exit")
    args = ap.parse_args(argv)
    try:
        if args.compact:
            compact(load_config(args.config))
        else:
            run(load_config(args.config), available_now=args.available_now)
    except MaterializeError as exc:
        print(f"pgrouter materialize: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
