"""pgrouter materializer: Kafka topics written by pgrouter -> one Delta table per routed table.

A standalone Spark Structured Streaming job. It depends only on pyspark, delta-spark and the
message format (README "Message format"), never on ``router/`` and never on PostgreSQL, so
``spark-submit actors/materialize/job.py --config FILE`` works on any cluster.

Rules this module keeps:

* Column types come from the schema topic (``source.schema_id`` -> ``TableSchema``), read with a
  Spark batch query whenever a micro-batch names a schema not seen yet. The router has every
  schema acknowledged before a record naming it, so reading the topic to its end finds it.
* Position = ``(source.commit_lsn, source.seq)``. Copies of one position are byte-identical, so
  dropping all but one is exact. Messages (``op: m``) are ignored.
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
  are NULL in rows written since; a column whose Spark type changes, or a changed key, stops
  the job with ``MaterializeError``. State mode refuses tables without key columns.
* Tables live at ``<warehouse>/<route>/<schema>/<table>``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tomllib
from dataclasses import dataclass, field
from typing import Any

# pyspark is imported lazily (in the functions that need it) so the pure parts (type mapping,
# config, array parsing) load without a JVM and without pyspark at all.

STATE, CHANGELOG = "state", "changelog"
OPS = ("c", "u", "d", "t", "r")
POS = ("_pgr_commit_lsn", "_pgr_seq")
TRUNCATE_PROPERTY = "pgrouter.truncated_before"
KEY_PROPERTY = "pgrouter.key"


class MaterializeError(Exception):
    """The job cannot go on without losing data or guessing (bad config, missing schema,
    incompatible type change, keyless table in state mode)."""

    def __init__(self, message: str, *, path: str | None = None):
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


# --- config ------------------------------------------------------------------------------------


@dataclass
class JobConfig:
    bootstrap_servers: str
    warehouse: str
    checkpoint: str
    topics: list[str] = field(default_factory=list)
    topic_pattern: str | None = None
    schema_topic: str = "pgrouter.schemas"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    kafka_options: dict[str, str] = field(default_factory=dict)
    mode: str = STATE
    trigger_interval: str | None = None  # None: next batch as soon as the previous ends
    master: str = "local[*]"
    app_name: str = "pgrouter-materialize"
    spark_conf: dict[str, str] = field(default_factory=dict)
    jars: list[str] = field(default_factory=list)


#: section -> key -> (type, JobConfig field). The stdlib twin of ``config.py``'s msgspec
#: Structs, so a bare ``spark-submit`` needs nothing but pyspark.
_KEYS: dict[str, dict[str, tuple[type, str]]] = {
    "kafka": {"bootstrap_servers": (str, "bootstrap_servers"), "topics": (list, "topics"),
              "topic_pattern": (str, "topic_pattern"), "schema_topic": (str, "schema_topic"),
              "starting_offsets": (str, "starting_offsets"),
              "max_offsets_per_trigger": (int, "max_offsets_per_trigger"),
              "options": (dict, "kafka_options")},
    "spark": {"master": (str, "master"), "app_name": (str, "app_name"),
              "conf": (dict, "spark_conf"), "jars": (list, "jars")},
    "delta": {"warehouse": (str, "warehouse"), "checkpoint": (str, "checkpoint"),
              "mode": (str, "mode"), "trigger_interval": (str, "trigger_interval"),
              "max_offsets_per_trigger": (int, "max_offsets_per_trigger")},
}


def config_from_dict(raw: dict[str, Any]) -> JobConfig:
    values: dict[str, Any] = {}
    for section, body in raw.items():
        if section == "max_offsets_per_trigger":
            body, section_keys = {section: body}, {section: (int, section)}
            prefix = ""
        elif section in _KEYS:
            if not isinstance(body, dict):
                raise MaterializeError("expected a table", path=section)
            section_keys, prefix = _KEYS[section], f"{section}."
        else:
            raise MaterializeError("unknown key", path=section)
        for key, value in body.items():
            if key not in section_keys:
                raise MaterializeError("unknown key", path=f"{prefix}{key}")
            typ, name = section_keys[key]
            if not isinstance(value, typ) or isinstance(value, bool):
                raise MaterializeError(f"expected {typ.__name__}", path=f"{prefix}{key}")
            if name in values:
                raise MaterializeError("given twice", path=f"{prefix}{key}")
            values[name] = value
    return validate(values)


def validate(values: dict[str, Any]) -> JobConfig:
    for need, where in (("bootstrap_servers", "kafka"), ("warehouse", "delta"),
                        ("checkpoint", "delta")):
        if not values.get(need):
            raise MaterializeError("required", path=f"{where}.{need}")
    if bool(values.get("topics")) == bool(values.get("topic_pattern")):
        raise MaterializeError("give exactly one of topics (a non-empty list) or topic_pattern",
                               path="kafka.topics")
    if values.get("mode", STATE) not in (STATE, CHANGELOG):
        raise MaterializeError("must be 'state' or 'changelog'", path="delta.mode")
    if values.get("max_offsets_per_trigger") is not None and values["max_offsets_per_trigger"] < 1:
        raise MaterializeError("must be >= 1", path="max_offsets_per_trigger")
    values["spark_conf"] = {k: str(v).lower() if isinstance(v, bool) else str(v)
                            for k, v in values.get("spark_conf", {}).items()}
    values["kafka_options"] = {k: str(v) for k, v in values.get("kafka_options", {}).items()}
    return JobConfig(**values)


def load_config(path: str) -> JobConfig:
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise MaterializeError(f"cannot read {path}: {exc}") from exc
    return config_from_dict(raw)


# --- types ---------------------------------------------------------------------------------------

_TEXT_TYPES = {"text", "varchar", "bpchar", "name", "char", "uuid", "json", "jsonb", "interval",
               "time", "timetz", "xml", "inet", "cidr", "macaddr", "money", "bit", "varbit"}


def spark_type_name(col: dict) -> str:
    """Spark SQL type (DDL string) of a ``ColumnSchema`` dict. Unknown types stay text: the
    router sends PostgreSQL's text form, which is lossless."""
    t = col["type"]
    if t.startswith("_"):
        elem = _scalar_type(col.get("element") or t[1:], None, None)
        return f"array<{elem}>" if elem not in ("binary",) else "string"
    return _scalar_type(t, col.get("precision"), col.get("scale"))


def _scalar_type(t: str, precision: int | None, scale: int | None) -> str:
    simple = {"int2": "smallint", "int4": "int", "int8": "bigint", "oid": "bigint",
              "float4": "float", "float8": "double", "bool": "boolean", "date": "date",
              "timestamp": "timestamp_ntz", "timestamptz": "timestamp", "bytea": "binary"}
    if t in simple:
        return simple[t]
    if t == "numeric":
        # unconstrained numeric has up to 131072 digits and NaN/±Infinity: only text is
        # lossless (decimal(38,18) would round or overflow). Constrained numeric that fits
        # Spark's 38 digits becomes a decimal; a negative scale widens it to whole numbers.
        if precision is None:
            return "string"
        s = scale or 0
        p = precision - s if s < 0 else max(precision, s)
        s = max(s, 0)
        return f"decimal({p},{s})" if p <= 38 else "string"
    return "string"


def parse_pg_array(text: str | None) -> list[str | None] | None:
    """PostgreSQL's text form of a one-dimensional array -> element texts (NULL -> None)."""
    if text is None:
        return None
    if text.startswith("["):  # explicit bounds: "[0:1]={1,2}"
        text = text[text.index("=") + 1:]
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"not an array literal: {text[:40]!r}")
    out: list[str | None] = []
    i, n = 1, len(text) - 1
    if n == 1:
        return out
    while i <= n:
        if text[i] == "{":
            raise ValueError("multi-dimensional arrays are not supported")
        if text[i] == '"':
            i += 1
            buf = []
            while text[i] != '"':
                if text[i] == "\\":
                    i += 1
                buf.append(text[i])
                i += 1
            out.append("".join(buf))
            i += 1
        else:
            j = i
            while j < n and text[j] != ",":
                j += 1
            item = text[i:j].strip()
            out.append(None if item.upper() == "NULL" else item)
            i = j
        i += 1  # the comma (or the closing brace)
    return out


def convert(raw, col: dict):
    """Column expression: the raw JSON text of a value (``raw``) -> its Spark value."""
    from pyspark.sql import functions as F

    dtype = spark_type_name(col)
    if dtype == "string":
        return raw
    if dtype == "binary":
        return F.unhex(F.substring(raw, 3, 1 << 30))
    if dtype.startswith("array<"):
        return _array_udf()(raw).cast(dtype)
    if dtype.startswith(("decimal", "date", "timestamp")):
        # ±infinity dates/timestamps and NaN in numeric(p,s) have no Spark value: NULL
        return raw.try_cast(dtype)
    return raw.cast(dtype)


_UDF = None


def _array_udf():
    global _UDF
    if _UDF is None:
        from pyspark.sql import functions as F
        from pyspark.sql.types import ArrayType, StringType
        _UDF = F.udf(lambda text: parse_pg_array(text), ArrayType(StringType()), useArrow=False)
    return _UDF


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def table_path(warehouse: str, route: str, schema: str, table: str) -> str:
    safe = [p.replace("/", "_") for p in (route or "_", schema, table)]
    return "/".join([warehouse.rstrip("/"), *safe])


# --- the streaming job -------------------------------------------------------------------------


def envelope_schema():
    from pyspark.sql.types import (ArrayType, LongType, StringType, StructField, StructType)
    source = StructType([StructField(n, t) for n, t in (
        ("schema", StringType()), ("table", StringType()), ("lsn", LongType()),
        ("commit_lsn", LongType()), ("seq", LongType()), ("xid", LongType()),
        ("commit_time", StringType()), ("route", StringType()), ("schema_id", StringType()))])
    return StructType([StructField("op", StringType()), StructField("before", StringType()),
                       StructField("after", StringType()), StructField("source", source),
                       StructField("ts_ms", LongType()),
                       StructField("unchanged_toast", ArrayType(StringType()))])


@dataclass
class TableState:
    path: str
    types: dict[str, str]  # column -> Spark DDL type, as stored
    truncated_before: tuple[int, int] | None
    key: tuple[str, ...] | None


class Materializer:
    """Owns the streaming query and what the driver remembers between micro-batches."""

    def __init__(self, spark, cfg: JobConfig):
        self.spark = spark
        self.cfg = cfg
        self.schemas: dict[str, dict] = {}
        self.tables: dict[str, TableState] = {}
        self.app_id = "pgrouter-" + hashlib.sha256(cfg.checkpoint.encode()).hexdigest()[:16]
        self.failure: BaseException | None = None

    # schema topic ---------------------------------------------------------------------------

    def load_schemas(self) -> None:
        c = self.cfg
        df = (self.spark.read.format("kafka").option("kafka.bootstrap.servers", c.bootstrap_servers)
              .options(**c.kafka_options).option("subscribe", c.schema_topic)
              .option("startingOffsets", "earliest").option("endingOffsets", "latest").load())
        for row in df.selectExpr("CAST(value AS STRING) AS v").collect():
            if row.v:
                s = json.loads(row.v)
                self.schemas[s["schema_id"]] = s

    def schema(self, schema_id: str) -> dict:
        if schema_id not in self.schemas:
            self.load_schemas()
        if schema_id not in self.schemas:
            raise MaterializeError(f"schema {schema_id} is not in the schema topic "
                                   f"{self.cfg.schema_topic!r} (wrong [kafka] schema_topic?)")
        return self.schemas[schema_id]

    # the query ------------------------------------------------------------------------------

    def start(self, *, available_now: bool = False):
        c = self.cfg
        reader = (self.spark.readStream.format("kafka")
                  .option("kafka.bootstrap.servers", c.bootstrap_servers)
                  .option("startingOffsets", c.starting_offsets).options(**c.kafka_options))
        if c.topics:
            reader = reader.option("subscribe", ",".join(c.topics))
        else:
            reader = reader.option("subscribePattern", c.topic_pattern)
        if c.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", c.max_offsets_per_trigger)
        writer = (reader.load().writeStream.foreachBatch(self.process_batch)
                  .option("checkpointLocation", c.checkpoint)
                  .queryName(f"pgrouter-materialize-{self.app_id}"))
        if available_now:
            writer = writer.trigger(availableNow=True)
        elif c.trigger_interval:
            writer = writer.trigger(processingTime=c.trigger_interval)
        return writer.start()

    def run(self, *, available_now: bool = False) -> None:
        query = self.start(available_now=available_now)
        try:
            query.awaitTermination()
        except Exception as exc:
            if self.failure is not None:
                raise self.failure from None
            raise MaterializeError(f"streaming query failed: {str(exc).splitlines()[0]}") from exc
        finally:
            if query.isActive:
                query.stop()

    def process_batch(self, df, batch_id: int) -> None:
        try:
            self._process(df, batch_id)
        except BaseException as exc:
            self.failure = exc
            raise

    def _process(self, df, batch_id: int) -> None:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        env = (df.filter(F.col("topic") != self.cfg.schema_topic)
               .select(F.from_json(F.col("value").cast("string"), envelope_schema()).alias("e"))
               .select("e.*").filter(F.col("op").isin(*OPS)).persist(StorageLevel.MEMORY_AND_DISK))
        try:
            meta = (env.select("source.route", "source.schema", "source.table", "source.schema_id",
                               "op", "source.commit_lsn", "source.seq",
                               F.explode_outer("unchanged_toast").alias("toast"))
                    .groupBy("route", "schema", "table", "schema_id")
                    .agg(F.collect_set("toast").alias("toast"),
                         F.max(F.when(F.col("op") == "t", F.struct("commit_lsn", "seq")))
                         .alias("truncate"), F.min("commit_lsn").alias("lo"))
                    .collect())
            groups: dict[tuple, list] = {}
            for m in meta:
                groups.setdefault((m.route, m.schema, m.table), []).append(m)
            for (route, schema, table), ms in sorted(groups.items(), key=lambda kv: str(kv[0])):
                sub = env.filter((F.col("source.route").eqNullSafe(F.lit(route)))
                                 & (F.col("source.schema") == schema)
                                 & (F.col("source.table") == table))
                self._table(batch_id, route, schema, table, ms, sub)
        finally:
            env.unpersist()

    # one table --------------------------------------------------------------------------------

    def _table(self, batch_id, route, schema, table, metas, sub) -> None:
        from pyspark.sql import functions as F

        mode = self.cfg.mode
        name = f"{schema}.{table}"
        schemas = [self.schema(m.schema_id) for m in metas]
        keys = tuple(schemas[-1]["key_columns"])
        for s in schemas:
            if tuple(s["key_columns"]) != keys:
                raise MaterializeError(f"{name}: key columns changed from {list(keys)} to "
                                       f"{list(s['key_columns'])} (schema {s['schema_id']})")
        if mode == STATE and not keys:
            raise MaterializeError(
                f"{name} has no key columns (replica identity "
                f"{schemas[-1].get('replica_identity')}): state mode cannot tell its rows apart; "
                "give it a primary key or REPLICA IDENTITY USING INDEX, or use mode = \"changelog\"")
        wanted: dict[str, str] = {}
        for s in schemas:
            for c in s["columns"]:
                t = spark_type_name(c)
                if wanted.setdefault(c["name"], t) != t:
                    raise MaterializeError(f"{name}.{c['name']}: incompatible type change "
                                           f"{wanted[c['name']]} -> {t}")
        state = self._ensure_table(route, schema, table, wanted, keys)
        truncs = [tuple(m.truncate) for m in metas if m.truncate is not None]
        toast = sorted({t for m in metas for t in m.toast})

        rows = None
        for m, s in zip(metas, schemas):
            part = self._changes(sub.filter(F.col("source.schema_id") == m.schema_id), s, state)
            rows = part if rows is None else rows.unionByName(part)
        if mode == CHANGELOG:
            self._append(batch_id, state, rows, min(m.lo for m in metas))
            return
        cut = max([*truncs, state.truncated_before or (-1, -1)])
        if truncs and max(truncs) > (state.truncated_before or (-1, -1)):
            t = max(truncs)
            self.spark.sql(f"DELETE FROM delta.{quote(state.path)} WHERE _pgr_commit_lsn < {t[0]} "
                           f"OR (_pgr_commit_lsn = {t[0]} AND _pgr_seq < {t[1]})")
            self.spark.sql(f"ALTER TABLE delta.{quote(state.path)} SET TBLPROPERTIES "
                           f"('{TRUNCATE_PROPERTY}' = '{t[0]}:{t[1]}')")
            state.truncated_before = t
        rows = rows.filter((F.col("_pgr_op") != "t") & (
            (F.col("_pgr_commit_lsn") > cut[0])
            | ((F.col("_pgr_commit_lsn") == cut[0]) & (F.col("_pgr_seq") > cut[1]))))
        self._merge(batch_id, state, rows, keys, toast)

    def _changes(self, sub, s: dict, state: TableState):
        """Typed change rows of one schema: every table column (NULL where this schema has
        none), the position, op and unchanged-TOAST names; key-changing updates add a delete
        of the old key at the same position."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import StringType, StructField, StructType

        cols = {c["name"]: c for c in s["columns"]}
        raw = StructType([StructField(n, StringType()) for n in cols])
        p = sub.select("op", "source", "ts_ms", "before",
                       F.coalesce("unchanged_toast", F.array().cast("array<string>")).alias("t"),
                       F.from_json("after", raw).alias("_a"), F.from_json("before", raw).alias("_b"))
        keys = s["key_columns"]
        if keys and self.cfg.mode == STATE:
            moved = F.lit(False)
            for k in keys:
                moved = moved | ~F.col("_b").getField(k).eqNullSafe(F.col("_a").getField(k))
            old = (p.filter((F.col("op") == "u") & F.col("_b").isNotNull() & moved)
                   .withColumn("op", F.lit("d")))
            p = p.unionByName(old)
        out = []
        for n, dtype in state.types.items():
            if n.startswith("_pgr_"):
                continue
            if n in cols:
                img = F.when(F.col("op") == "d", F.col("_b").getField(n)) \
                       .otherwise(F.col("_a").getField(n))
                out.append(convert(img, cols[n]).alias(n))
            else:
                out.append(F.lit(None).cast(dtype).alias(n))
        meta = [F.col("op").alias("_pgr_op"), F.col("source.commit_lsn").alias("_pgr_commit_lsn"),
                F.col("source.seq").alias("_pgr_seq"), F.col("t").alias("_pgr_toast")]
        if self.cfg.mode == CHANGELOG:
            meta += [F.col("source.lsn").alias("_pgr_lsn"), F.col("source.xid").alias("_pgr_xid"),
                     F.col("source.commit_time").try_cast("timestamp").alias("_pgr_commit_time"),
                     F.col("source.schema_id").alias("_pgr_schema_id"),
                     F.col("before").alias("_pgr_before")]
        return p.select(*out, *meta)

    def _ensure_table(self, route, schema, table, wanted: dict[str, str], keys) -> TableState:
        from delta.tables import DeltaTable

        path = table_path(self.cfg.warehouse, route, schema, table)
        state = self.tables.get(path)
        if state is None:
            if DeltaTable.isDeltaTable(self.spark, path):
                dt = DeltaTable.forPath(self.spark, path)
                types = {f.name: f.dataType.simpleString() for f in dt.toDF().schema.fields}
                props = dt.detail().collect()[0].properties or {}
                tb = props.get(TRUNCATE_PROPERTY)
                key = props.get(KEY_PROPERTY)
                state = TableState(path, types,
                                   tuple(int(x) for x in tb.split(":")) if tb else None,
                                   tuple(json.loads(key)) if key else None)
            else:
                cols = dict(wanted)
                if self.cfg.mode == STATE:
                    cols.update(_pgr_commit_lsn="bigint", _pgr_seq="bigint", _pgr_deleted="boolean")
                else:
                    cols.update(_pgr_op="string", _pgr_commit_lsn="bigint", _pgr_seq="bigint",
                                _pgr_lsn="bigint", _pgr_xid="bigint", _pgr_commit_time="timestamp",
                                _pgr_schema_id="string", _pgr_toast="array<string>",
                                _pgr_before="string")
                ddl = ", ".join(f"{quote(n)} {t}" for n, t in cols.items())
                self.spark.sql(f"CREATE TABLE IF NOT EXISTS delta.{quote(path)} ({ddl}) USING delta "
                               f"TBLPROPERTIES ('{KEY_PROPERTY}' = '{json.dumps(list(keys))}')")
                state = TableState(path, cols, None, tuple(keys))
            self.tables[path] = state
        if state.key is not None and self.cfg.mode == STATE and tuple(keys) != state.key:
            raise MaterializeError(f"{schema}.{table}: key columns changed from "
                                   f"{list(state.key)} to {list(keys)}")
        for n, t in wanted.items():
            have = state.types.get(n)
            if have is None:
                self.spark.sql(f"ALTER TABLE delta.{quote(path)} ADD COLUMNS ({quote(n)} {t})")
                state.types[n] = t
            elif have != t:
                raise MaterializeError(f"{schema}.{table}.{n}: incompatible type change: the "
                                       f"Delta table has {have}, the new schema needs {t}; "
                                       f"materialize into a new warehouse or migrate the table")
        return state

    def _txn(self, batch_id: int):
        conf = self.spark.conf
        conf.set("spark.databricks.delta.write.txnAppId", self.app_id)
        conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))

    def _untxn(self):
        self.spark.conf.unset("spark.databricks.delta.write.txnAppId")
        self.spark.conf.unset("spark.databricks.delta.write.txnVersion")

    def _merge(self, batch_id, state: TableState, rows, keys, toast) -> None:
        from delta.tables import DeltaTable
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        order = (F.col("_pgr_commit_lsn"), F.col("_pgr_seq"), F.col("_pgr_op") != "d")
        toast = [c for c in toast if c in state.types]
        if toast:
            # an unchanged-TOAST value is the key's previous value: the last one in this batch
            # if there is one (carried forward), else the stored one (see the MERGE below)
            w = (Window.partitionBy(*keys).orderBy(*order)
                 .rowsBetween(Window.unboundedPreceding, Window.currentRow))
            filled = {}
            for c in toast:
                given = F.when(~F.array_contains("_pgr_toast", c), F.struct(F.col(c).alias("v")))
                filled[c] = F.last(given, ignorenulls=True).over(w)
            rows = rows.select(*[filled[c].getField("v").alias(c) if c in filled else F.col(c)
                                 for c in rows.columns if c != "_pgr_toast"],
                               F.array_compact(F.array(*[F.when(filled[c].isNull(), F.lit(c))
                                                         for c in filled])).alias("_pgr_toast"))
        latest = Window.partitionBy(*keys).orderBy(*[o.desc() for o in order])
        src = (rows.withColumn("_pgr_n", F.row_number().over(latest)).filter("_pgr_n = 1")
               .withColumn("_pgr_deleted", F.col("_pgr_op") == "d"))
        data = [n for n in state.types if not n.startswith("_pgr_")]
        newer = ("s._pgr_commit_lsn > t._pgr_commit_lsn OR (s._pgr_commit_lsn = t._pgr_commit_lsn"
                 " AND s._pgr_seq > t._pgr_seq)")
        sets = {}
        for n in data:
            q = quote(n)
            if n in toast:
                lit = n.replace("\\", "\\\\").replace("'", "\\'")
                sets[q] = f"CASE WHEN array_contains(s._pgr_toast, '{lit}') THEN t.{q} ELSE s.{q} END"
            else:
                sets[q] = f"s.{q}"
        for n in ("_pgr_commit_lsn", "_pgr_seq", "_pgr_deleted"):
            sets[n] = f"s.{n}"
        inserts = {quote(n): f"s.{quote(n)}" for n in [*data, *POS, "_pgr_deleted"]}
        cond = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in keys)
        self._txn(batch_id)
        try:
            (DeltaTable.forPath(self.spark, state.path).alias("t").merge(src.alias("s"), cond)
             .whenMatchedUpdate(condition=newer, set=sets).whenNotMatchedInsert(values=inserts)
             .execute())
        finally:
            self._untxn()

    def _append(self, batch_id, state: TableState, rows, lo: int) -> None:
        from delta.tables import DeltaTable

        rows = rows.dropDuplicates(list(POS))
        cond = (f"t._pgr_commit_lsn >= {lo} AND t._pgr_commit_lsn = s._pgr_commit_lsn "
                "AND t._pgr_seq = s._pgr_seq")
        values = {quote(n): f"s.{quote(n)}" for n in state.types}
        self._txn(batch_id)
        try:
            (DeltaTable.forPath(self.spark, state.path).alias("t").merge(rows.alias("s"), cond)
             .whenNotMatchedInsert(values=values).execute())
        finally:
            self._untxn()


# --- session and entry point ---------------------------------------------------------------------

DEFAULT_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.databricks.delta.write.txnVersion.autoReset.enabled": "false",
}


def build_session(cfg: JobConfig):
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(cfg.app_name)
    if not SparkConf().contains("spark.master"):  # spark-submit --master wins
        builder = builder.master(cfg.master)
    conf = {**DEFAULT_CONF, **cfg.spark_conf}
    if cfg.jars:
        conf["spark.jars"] = ",".join([*cfg.jars, *filter(None, [conf.get("spark.jars")])])
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def run(cfg: JobConfig, *, available_now: bool = False, spark=None) -> None:
    spark = spark or build_session(cfg)
    Materializer(spark, cfg).run(available_now=available_now)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="materialize pgrouter topics into Delta tables")
    ap.add_argument("--config", "-c", required=True, help="materialize TOML config")
    ap.add_argument("--available-now", action="store_true",
                    help="process what is in Kafka now, then exit")
    args = ap.parse_args(argv)
    try:
        run(load_config(args.config), available_now=args.available_now)
    except MaterializeError as exc:
        print(f"pgrouter materialize: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
