"""The Iceberg tables the job writes (``[output] format = "iceberg"``): the same tables as the
Delta ones (``tables``), in an Iceberg catalog of the Spark session.

Rules:

* The catalog is registered in the running session (``spark.sql.catalog.<name>``, a runtime
  setting): ``jdbc`` keeps the tables' metadata pointers in a PostgreSQL database (Iceberg's
  ``JdbcCatalog``, schema V1, the same ``iceberg_tables`` that pyiceberg's ``SqlCatalog``
  reads), ``hadoop`` in the warehouse's files alone.
* A table is ``<catalog>.<route>.<schema>.<table>`` (a two-level namespace; with a hadoop
  catalog the files lie at ``<warehouse>/<route>/<schema>/<table>`` as Delta's do), format v2,
  written merge-on-read: a MERGE, UPDATE or DELETE writes position delete files instead of
  rewriting data files; compaction (``maintenance``) folds them in later.
* Exactly once: the commit of a micro-batch's write carries the snapshot summary properties
  ``pgrouter.app-id`` and ``pgrouter.batch-id``. A table whose live snapshots show this job's
  batch N (or later) skips batch N when it is re-run after a crash; the position guards of
  the MERGE make anything else idempotent (expired snapshots lose only that shortcut).
* The key columns are the table property ``pgrouter.key``, a truncate's position
  ``pgrouter.truncated_before`` (as in Delta). Columns are added with ``ALTER TABLE … ADD
  COLUMNS``; a widening is Iceberg's own type promotion (int -> bigint, float -> double, a
  decimal's precision at the same scale), anything else Iceberg refuses stops the job.
"""

from __future__ import annotations

import json

from .columns import quote
from .settings import JobConfig, MaterializeError
from .tables import KEY_PROPERTY, TRUNCATE_PROPERTY, DeltaTables, TableState

APP_PROPERTY, BATCH_PROPERTY = "pgrouter.app-id", "pgrouter.batch-id"
#: when compaction last ran on the table (UTC, ISO 8601): a table property, so it outlives the
#: compaction's snapshot, which expire_snapshots removes
COMPACTED_PROPERTY = "pgrouter.last-compaction"
_SNAPSHOT_CONF = "spark.sql.iceberg.snapshot-property."
#: merge-on-read, format v2: position deletes, which Spark writes and pyiceberg reads (v3's
#: deletion vectors are not read by pyiceberg 0.12). Distribution mode none: the rows and
#: deletes a MERGE writes are not shuffled again by data file before the write (hash, the
#: default, costs a shuffle per batch: 18.7 -> 14.9 CPU s per 500k records, bench/materialize.py);
#: a batch may then write two delete files for one data file, which compaction folds.
TABLE_PROPERTIES = {"format-version": "2", "write.merge.mode": "merge-on-read",
                    "write.update.mode": "merge-on-read", "write.delete.mode": "merge-on-read",
                    "write.merge.distribution-mode": "none",
                    "write.update.distribution-mode": "none",
                    "write.delete.distribution-mode": "none"}


def register_catalog(spark, cfg: JobConfig) -> None:
    """The ``[iceberg]`` catalog as ``cfg.iceberg_name`` of the session."""
    prefix = f"spark.sql.catalog.{cfg.iceberg_name}"
    conf = {prefix: "org.apache.iceberg.spark.SparkCatalog",
            f"{prefix}.type": cfg.iceberg_catalog, f"{prefix}.warehouse": cfg.iceberg_warehouse,
            # each micro-batch writes through a session of its own (foreachBatch), each with
            # its catalog instance: a cached table in one would miss the others' commits
            f"{prefix}.cache-enabled": "false"}
    if cfg.iceberg_catalog == "jdbc":
        conf[f"{prefix}.uri"] = cfg.iceberg_uri
        # V1 has the iceberg_type column (views); pyiceberg's SqlCatalog reads the same table
        conf[f"{prefix}.jdbc.schema-version"] = "V1"
        if cfg.iceberg_user:
            conf[f"{prefix}.jdbc.user"] = cfg.iceberg_user
        if cfg.iceberg_password:
            conf[f"{prefix}.jdbc.password"] = cfg.iceberg_password
    conf.update({f"{prefix}.{k}": v for k, v in cfg.iceberg_options.items()})
    for k, v in conf.items():
        spark.conf.set(k, v)


def table_ref(cfg: JobConfig, route, schema, table) -> str:
    return ".".join([cfg.iceberg_name, *(quote(p) for p in (route or "_", schema, table))])


class IcebergTables(DeltaTables):
    """``DeltaTables``' interface over Iceberg tables; ``state.path`` is the table's name."""

    kind = "Iceberg"
    using = "iceberg"

    def __init__(self, spark, cfg: JobConfig, app_id: str):
        super().__init__(spark, cfg)
        self.app_id = app_id
        self.last_batch: dict[str, int] = {}  # table -> the last batch this job committed
        register_catalog(spark, cfg)

    def ref(self, state: TableState) -> str:
        return state.path

    def read(self, state: TableState, session=None):
        """The stored rows, read in ``session`` (the micro-batch's own): a table read in the
        job's session and joined with the batch's rows fails once Spark refreshes the
        relation in the batch's session (its columns get other ids)."""
        return (session or self.spark).table(state.path)

    def ensure(self, route, schema, table, wanted: dict[str, str], keys) -> TableState:
        ref = table_ref(self.cfg, route, schema, table)
        if ref not in self.known and self.spark.catalog.tableExists(ref):
            types = {f.name: f.dataType.simpleString() for f in self.spark.table(ref).schema}
            props = {r[0]: r[1] for r in self.spark.sql(f"SHOW TBLPROPERTIES {ref}").collect()}
            tb, key = props.get(TRUNCATE_PROPERTY), props.get(KEY_PROPERTY)
            self.known[ref] = TableState(ref, types,
                                         tuple(int(x) for x in tb.split(":")) if tb else None,
                                         tuple(json.loads(key)) if key else None)
        elif ref not in self.known:
            ns = self.cfg.iceberg_name + "." + quote(route or "_")
            self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ns}")
            self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {ns}.{quote(schema)}")
        return self._ensure(ref, schema, table, wanted, keys)

    def _add_column(self, ref: str, name: str, dtype: str) -> None:
        self.spark.sql(f"ALTER TABLE {ref} ADD COLUMNS ({quote(name)} {dtype})")

    def _widen(self, ref: str, column: str, dtype: str) -> None:
        try:
            self.spark.sql(f"ALTER TABLE {ref} ALTER COLUMN {quote(column)} TYPE {dtype}")
        except Exception as exc:
            raise MaterializeError(f"{ref}.{column}: Iceberg cannot widen the column to "
                                   f"{dtype} (it promotes int -> bigint, float -> double and a "
                                   f"decimal's precision at the same scale): "
                                   f"{str(exc).splitlines()[0]}") from exc

    def _properties(self, state: TableState) -> dict[str, str]:
        return {**TABLE_PROPERTIES, **super()._properties(state)}

    def write_first(self, state: TableState, rows) -> None:
        from pyspark.sql import functions as F

        rows = rows.select(*[F.col(quote(n)).cast(t).alias(n) for n, t in state.types.items()])
        if state.created:
            rows.writeTo(state.path).append()
        else:
            writer = rows.writeTo(state.path).using("iceberg")
            for k, v in self._properties(state).items():
                writer = writer.tableProperty(k, v)
            writer.create()
            state.created = True
        state.empty = False

    # exactly once ---------------------------------------------------------------------------

    def committed(self, state: TableState, batch_id: int) -> bool:
        """Whether this job committed ``batch_id`` (or a later batch) to the table: its live
        snapshots are read once per table and run, then remembered."""
        if not state.created:
            return False
        last = self.last_batch.get(state.path)
        if last is None:
            row = self.spark.sql(
                f"SELECT max(CAST(summary['{BATCH_PROPERTY}'] AS BIGINT)) FROM "
                f"{state.path}.snapshots WHERE summary['{APP_PROPERTY}'] = '{self.app_id}'"
            ).collect()[0][0]
            last = self.last_batch[state.path] = -1 if row is None else row
        return last >= batch_id

    def commit_with(self, session, batch_id: int) -> None:
        """The next commits of ``session`` (the micro-batch's own: foreachBatch gives each
        its session) carry the batch (``uncommit`` ends it)."""
        session.conf.set(_SNAPSHOT_CONF + APP_PROPERTY, self.app_id)
        session.conf.set(_SNAPSHOT_CONF + BATCH_PROPERTY, str(batch_id))

    def uncommit(self, session, state: TableState, batch_id: int, done: bool) -> None:
        session.conf.unset(_SNAPSHOT_CONF + APP_PROPERTY)
        session.conf.unset(_SNAPSHOT_CONF + BATCH_PROPERTY)
        if done:
            self.last_batch[state.path] = batch_id

    def merge(self, state: TableState, src, cond: str, *, update: str | None,
              sets: dict[str, str], inserts: dict[str, str]) -> None:
        """``MERGE INTO`` the table from ``src`` (a temporary view of it): update matched
        rows where ``update`` holds (none: insert only), insert the others."""
        view = "pgr_src_" + self.app_id.replace("-", "_")
        src.createOrReplaceTempView(view)
        session = src.sparkSession  # foreachBatch's frames live in a session of their own
        try:
            matched = "" if update is None else (
                f"WHEN MATCHED AND ({update}) THEN UPDATE SET "
                + ", ".join(f"t.{k} = {v}" for k, v in sets.items()) + " ")
            session.sql(
                f"MERGE INTO {state.path} t USING {view} s ON {cond} {matched}"
                f"WHEN NOT MATCHED THEN INSERT ({', '.join(inserts)}) "
                f"VALUES ({', '.join(inserts.values())})")
        finally:
            session.catalog.dropTempView(view)


def all_tables(spark, cfg: JobConfig) -> list[str]:
    """Every table of the catalog under its two-level namespaces (``--compact``)."""
    register_catalog(spark, cfg)
    out = []
    for (route,) in spark.sql(f"SHOW NAMESPACES IN {cfg.iceberg_name}").collect():
        ns = f"{cfg.iceberg_name}.{quote(route.split('.')[-1])}"
        for (schema,) in spark.sql(f"SHOW NAMESPACES IN {ns}").collect():
            inner = f"{ns}.{quote(schema.split('.')[-1])}"
            out += [f"{inner}.{quote(r.tableName)}"
                    for r in spark.sql(f"SHOW TABLES IN {inner}").collect()]
    return sorted(out)


def table_stats(spark, ref: str) -> dict:
    """What a reader of the table pays now: ``rows`` (its live rows: a scan, tombstones left
    out), and from its metadata ``data_files``, ``delete_files`` (the position delete files
    and deletion vectors a scan plans) and ``last_compaction`` (the table property, None if
    never). Not the rows from the files' counts: delete files of a data file that a
    TRUNCATE or compaction removed stay counted until compaction drops them."""
    files = dict(spark.sql(f"SELECT content, count(*) FROM {ref}.files GROUP BY content")
                 .collect())
    props = {r[0]: r[1] for r in spark.sql(f"SHOW TBLPROPERTIES {ref}").collect()}
    table = spark.table(ref)
    if "_pgr_deleted" in table.columns:  # state mode
        table = table.filter("NOT _pgr_deleted")
    return {"rows": table.count(), "data_files": files.get(0, 0),
            "delete_files": files.get(1, 0) + files.get(2, 0),
            "last_compaction": props.get(COMPACTED_PROPERTY)}
