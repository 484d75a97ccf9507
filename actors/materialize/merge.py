"""The streaming query and its micro-batches: records parsed against their schema (JSON, or Avro
decoded by ``avro``), deduplicated and ordered by position, and merged (``state``) or appended
(``changelog``) into one table per routed table. The rules are in ``job``'s docstring."""

from __future__ import annotations

import functools
import hashlib
import json
import threading

from . import avro
from .columns import (CORRUPT, convert, envelope_schema, image_fields, image_schema, quote,
                      spark_type_name, widens)
from .batch_meta import meta_columns, summary
from .maintenance import Maintenance
from .schema_topic import read_schema_topic
from .settings import CHANGELOG, ICEBERG, STATE, JobConfig, MaterializeError, reason
from .tables import TRUNCATE_PROPERTY, DeltaTables, TableState
from .toast import fill_toast, moved_toast

OPS = ("c", "u", "d", "t", "r")
POS = ("_pgr_commit_lsn", "_pgr_seq")


class Materializer:
    """Owns the streaming query and what the driver remembers between micro-batches."""

    def __init__(self, spark, cfg: JobConfig):
        self.spark = spark
        self.cfg = cfg
        self.schemas: dict[str, dict] = {}
        self.app_id = "pgrouter-" + hashlib.sha256(cfg.checkpoint.encode()).hexdigest()[:16]
        if cfg.output_format == ICEBERG:
            from .iceberg import IcebergTables
            self.delta = IcebergTables(spark, cfg, self.app_id)
        else:
            self.delta = DeltaTables(spark, cfg)
        self.failure: BaseException | None = None
        self.maintenance = Maintenance(spark, cfg)
        self.registry = avro.RegistrySchemas(cfg.registry)
        self._first_load = threading.Lock()

    # schema topic ---------------------------------------------------------------------------

    def load_schemas(self) -> None:
        for value in read_schema_topic(self.spark, self.cfg):
            s = json.loads(value)
            self.schemas[s["schema_id"]] = s

    def first_schemas(self) -> None:
        """The schema topic read once before the first batch needs it: ``run`` reads it while
        the query plans its first batch, and the batch waits for that read."""
        with self._first_load:
            if not self.schemas:
                self.load_schemas()

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
            self.first_schemas()
            query.awaitTermination()
        except Exception as exc:
            if self.failure is not None:
                raise self.failure from None
            if isinstance(exc, MaterializeError):  # the schema topic read here
                raise
            raise MaterializeError(f"streaming query failed: {reason(exc)}") from exc
        finally:
            if query.isActive:
                query.stop()

    def process_batch(self, df, batch_id: int) -> None:
        try:
            self._process(df, batch_id)
        except Exception as exc:  # stops the query; ``run`` raises ``failure``
            self.failure = exc if isinstance(exc, MaterializeError) else MaterializeError(
                f"micro-batch {batch_id} failed: {reason(exc)}")
            raise
        except BaseException as exc:
            self.failure = exc
            raise

    def _image_fields(self) -> tuple[tuple[str, str], ...]:
        return image_fields(self.schemas.values())

    def _parse(self, df, fields):
        """The batch's records parsed once (only the fields the job uses) and persisted: every
        later action of the batch reads this, not Kafka. A record that does not parse (not
        JSON, or a value not of its column's JSON type) keeps its text in ``CORRUPT`` and its
        Kafka position in ``_pgr_at``, for ``_process`` to stop on. An Avro record is kept as
        it is (``avro.AVRO``, with its schema's id ``avro.RID`` and its position), for
        ``_decode_avro``. Others are left out by ``_kept``, above the cache (below it Spark
        pushes the filter under the parse, run 3 times a record then: docs/materializer.md)."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        schema = envelope_schema(fields, changelog=self.cfg.mode == CHANGELOG)
        rid, value = avro.wire_columns(F.col("value"))
        text = F.when(rid.isNull(), F.col("value").cast("string"))
        parsed = F.from_json(text, schema,
                             {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
        kept = F.col(f"e.{CORRUPT}").isNotNull() | F.col(avro.RID).isNotNull()
        return (df.filter(F.col("topic") != self.cfg.schema_topic)
                .select(parsed.alias("e"), "topic", "partition", "offset", rid.alias(avro.RID),
                        value.alias(avro.AVRO))
                .select("e.*", F.when(kept, F.struct("topic", "partition", "offset"))
                        .alias("_pgr_at"), avro.RID, avro.AVRO)
                .persist(StorageLevel.MEMORY_AND_DISK))

    @staticmethod
    def _kept(env):
        """Of the cached ``env``: change records, records that do not parse, Avro records."""
        from pyspark.sql.functions import col
        return env.filter(col("op").isin(*OPS) | col(CORRUPT).isNotNull()
                          | col(avro.RID).isNotNull())

    def _decode_avro(self, env, rids: dict) -> tuple[dict, list]:
        """The Avro records of ``env`` decoded, one persisted frame per registry id of
        ``rids`` (id -> its first record's position), and what ``_meta`` says of them. Ids of
        schemas that are not change records (messages) are skipped."""
        from pyspark import StorageLevel

        frames = {}
        for rid, at in sorted(rids.items()):
            how = self.registry.reader(rid, at)
            if how is not None:
                frames[rid] = avro.decode(env, rid, how,
                                          changelog=self.cfg.mode == CHANGELOG).persist(
                                              StorageLevel.MEMORY_AND_DISK)
        if not frames:
            return frames, []
        parts = [meta_columns(f) for f in frames.values()]
        return frames, summary(functools.reduce(lambda a, b: a.unionByName(b), parts))

    def _process(self, df, batch_id: int) -> None:
        self.first_schemas()
        fields = self._image_fields()
        env = self._parse(df, fields)
        frames: dict = {}  # registry id -> its Avro records, decoded
        try:
            meta = summary(meta_columns(self._kept(env)))
            if any(m.schema_id not in self.schemas for m in meta if m.rid is None):
                self.load_schemas()  # a schema newer than the ones known: its columns too
                if self._image_fields() != fields:
                    env.unpersist()
                    fields = self._image_fields()
                    env = self._parse(df, fields)
                    meta = summary(meta_columns(self._kept(env)))
            rids = {m.rid: m.at for m in meta if m.rid is not None}
            meta = [m for m in meta if m.rid is None]
            if rids:
                frames, decoded = self._decode_avro(self._kept(env), rids)
                if any(m.schema_id not in self.schemas for m in decoded):
                    self.load_schemas()
                meta += decoded
            self._refuse_corrupt(meta)
            groups: dict[tuple, list] = {}
            for m in meta:
                groups.setdefault((m.route, m.schema, m.table), []).append(m)
            for (route, schema, table), ms in sorted(groups.items(), key=lambda kv: str(kv[0])):
                try:
                    self._table(batch_id, route, schema, table, ms, self._kept(env), frames)
                except MaterializeError:
                    raise
                except Exception as exc:  # e.g. a value a Python worker refused
                    raise MaterializeError(f"{schema}.{table}: {reason(exc)}") from exc
        finally:
            env.unpersist()
            for frame in frames.values():
                frame.unpersist()
        if self.maintenance.due():
            self.maintenance.run(p for p, t in self.delta.known.items() if t.created)

    def _refuse_corrupt(self, meta) -> None:
        """A record that is not a pgrouter change record stops the job before anything of the
        batch is written (skipping it would lose a change, reading half of it would store a
        wrong row)."""
        bad = [(m.corrupt, m.rid) for m in meta if m.corrupt is not None]
        if bad:
            (at, text), rid = min(bad, key=lambda b: tuple(b[0][0]))
            why = (f"not JSON, or a value that does not fit its column's type in the schema "
                   f"topic {self.cfg.schema_topic!r}" if rid is None else
                   f"Avro that does not decode with schema id {rid} of the registry")
            raise MaterializeError(f"record at {at.topic} partition {at.partition} offset "
                                   f"{at.offset} is not a pgrouter change record ({why}): "
                                   f"{text!r}")

    # one table --------------------------------------------------------------------------------

    def _table(self, batch_id, route, schema, table, metas, env, frames) -> None:
        """One table's changes of the batch (``metas``: one per schema of it): from ``env``,
        or from the decoded Avro records of ``frames`` for a meta with a registry id."""
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
                t, had = spark_type_name(c), wanted.get(c["name"])
                if had is None or widens(had, t):
                    wanted[c["name"]] = t
                elif not widens(t, had):
                    raise MaterializeError(f"{name}.{c['name']}: incompatible type change "
                                           f"{had} -> {t} (only widening changes apply: "
                                           f"README \"Schema changes\")")
        state = self.delta.ensure(route, schema, table, wanted, keys)
        if self.delta.committed(state, batch_id):  # Iceberg: a re-run batch it has
            return
        truncs = [tuple(m.truncate) for m in metas if m.truncate is not None]
        toast = sorted({t for m in metas for t in m.toast})

        rows = None
        for m, s in zip(metas, schemas):
            sub = (env if m.rid is None else frames[m.rid]).filter(
                F.col("source.route").eqNullSafe(F.lit(route)) & (F.col("source.schema") == schema)
                & (F.col("source.table") == table) & (F.col("source.schema_id") == m.schema_id))
            part = self._changes(sub, s, state, moves=bool(m.before), typed=m.rid is not None)
            rows = part if rows is None else rows.unionByName(part)
        if mode == CHANGELOG:
            self._append(batch_id, state, rows, min(m.lo for m in metas))
            return
        cut = max([*truncs, state.truncated_before or (-1, -1)])
        if truncs and max(truncs) > (state.truncated_before or (-1, -1)):
            t = max(truncs)
            self.delta.create(state)  # a new table's first batch: the truncate is its property
            ref = self.delta.ref(state)
            self.spark.sql(f"DELETE FROM {ref} WHERE _pgr_commit_lsn < {t[0]} "
                           f"OR (_pgr_commit_lsn = {t[0]} AND _pgr_seq < {t[1]})")
            self.spark.sql(f"ALTER TABLE {ref} SET TBLPROPERTIES "
                           f"('{TRUNCATE_PROPERTY}' = '{t[0]}:{t[1]}')")
            state.truncated_before = t
        rows = rows.filter((F.col("_pgr_op") != "t") & (
            (F.col("_pgr_commit_lsn") > cut[0])
            | ((F.col("_pgr_commit_lsn") == cut[0]) & (F.col("_pgr_seq") > cut[1]))))
        self._merge(batch_id, state, rows, keys, toast, moves=any(m.before for m in metas))

    def _changes(self, sub, s: dict, state: TableState, *, moves: bool, typed: bool = False):
        """Typed change rows of one schema: every table column (NULL where this schema has
        none), the position, op and unchanged-TOAST names; key-changing updates add a delete
        of the old key at the same position. ``moves``: some update of the batch has a
        ``before`` image (only those can change the key); without one the plan has no second
        branch to scan. ``typed``: decoded Avro records, whose images are typed already
        (``avro.value`` converts them) and whose ``before`` is a struct in both modes."""
        from pyspark.sql import functions as F

        cols = {c["name"]: c for c in s["columns"]}
        have = ({f.name: f.dataType for f in sub.schema["after"].dataType.fields}
                if typed else {})
        before = (F.from_json("before", image_schema(image_fields([s])))
                  if self.cfg.mode == CHANGELOG and not typed else F.col("before"))
        p = sub.select("op", "source", "before",
                       F.coalesce("unchanged_toast", F.array().cast("array<string>")).alias("t"),
                       F.col("after").alias("_a"), before.alias("_b"))
        keys = s["key_columns"]
        if keys and self.cfg.mode == STATE and not moves:
            p = p.withColumn("_m", F.lit(None).cast("string"))
        elif keys and self.cfg.mode == STATE:
            moved = F.lit(False)
            for k in keys:
                moved = moved | ~F.col("_b").getField(k).eqNullSafe(F.col("_a").getField(k))
            moves = (F.col("op") == "u") & F.col("_b").isNotNull() & moved
            old = p.filter(moves).withColumn("op", F.lit("d")).withColumn("_m", F.lit("from"))
            p = p.withColumn("_m", F.when(moves, F.lit("to"))).unionByName(old)
        out = []
        for n, dtype in state.types.items():
            if n.startswith("_pgr_"):
                continue
            if n in cols and (not typed or n in have):
                img = F.when(F.col("op") == "d", F.col("_b").getField(n)) \
                       .otherwise(F.col("_a").getField(n))
                value = avro.value(img, cols[n], have[n]) if typed else convert(img, cols[n])
                out.append(value.alias(n))
            else:
                out.append(F.lit(None).cast(dtype).alias(n))
        meta = [F.col("op").alias("_pgr_op"), F.col("source.commit_lsn").alias("_pgr_commit_lsn"),
                F.col("source.seq").alias("_pgr_seq"), F.col("t").alias("_pgr_toast"),
                # state mode keeps only a delete's commit time: its text is parsed after the
                # batch is collapsed to one change per key (``_merge``), not for every change
                (F.col("source.commit_time") if self.cfg.mode == STATE else
                 F.col("source.commit_time").try_cast("timestamp")).alias("_pgr_commit_time")]
        if keys and self.cfg.mode == STATE:
            meta.append(F.col("_m").alias("_pgr_move"))
        if self.cfg.mode == CHANGELOG:
            meta += [F.col("source.lsn").alias("_pgr_lsn"), F.col("source.xid").alias("_pgr_xid"),
                     F.col("source.schema_id").alias("_pgr_schema_id"),
                     # Avro: the typed image as JSON (Spark's to_json), not the router's text
                     (F.to_json("before") if typed else F.col("before")).alias("_pgr_before")]
        return p.select(*out, *meta)

    def _txn(self, batch_id: int, rows):
        if self.cfg.output_format == ICEBERG:
            self.delta.commit_with(rows.sparkSession, batch_id)
            return
        conf = self.spark.conf
        conf.set("spark.databricks.delta.write.txnAppId", self.app_id)
        conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))

    def _untxn(self, rows, state: TableState, batch_id: int, done: bool):
        if self.cfg.output_format == ICEBERG:
            self.delta.uncommit(rows.sparkSession, state, batch_id, done)
            return
        self.spark.conf.unset("spark.databricks.delta.write.txnAppId")
        self.spark.conf.unset("spark.databricks.delta.write.txnVersion")

    def _merge(self, batch_id, state: TableState, rows, keys, toast, *, moves: bool) -> None:
        from delta.tables import DeltaTable
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        order = (F.col("_pgr_commit_lsn"), F.col("_pgr_seq"), F.col("_pgr_op") != "d")
        toast = [c for c in toast if c in state.types]
        if toast:
            filled = fill_toast(rows, keys, toast, order)
            if moves:  # key changes: unchanged-TOAST values come from the old key
                self.delta.create(state)  # (read from the table, empty if new)
                stored = self.delta.read(state, rows.sparkSession)
                rows = fill_toast(moved_toast(stored, rows, filled, keys, toast), keys, toast,
                                  order)
            else:
                rows = filled
        latest = Window.partitionBy(*keys).orderBy(*[o.desc() for o in order])
        src = (rows.withColumn("_pgr_n", F.row_number().over(latest)).filter("_pgr_n = 1")
               .withColumn("_pgr_deleted", F.col("_pgr_op") == "d")
               .withColumn("_pgr_deleted_at",
                           F.when(F.col("_pgr_deleted"),
                                  F.col("_pgr_commit_time").try_cast("timestamp"))))
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
        for n in ("_pgr_commit_lsn", "_pgr_seq", "_pgr_deleted", "_pgr_deleted_at"):
            sets[n] = f"s.{n}"
        inserts = {quote(n): f"s.{quote(n)}" for n in [*data, *POS, "_pgr_deleted",
                                                       "_pgr_deleted_at"]}
        cond = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in keys)
        self._txn(batch_id, src)
        done = False
        try:
            if state.empty:  # the MERGE would insert every row: one plain write, no join
                self.delta.write_first(state, src)
            elif self.cfg.output_format == ICEBERG:
                self.delta.merge(state, src, cond, update=newer, sets=sets, inserts=inserts)
            else:
                (DeltaTable.forPath(self.spark, state.path).alias("t").merge(src.alias("s"), cond)
                 .whenMatchedUpdate(condition=newer, set=sets)
                 .whenNotMatchedInsert(values=inserts).execute())
            done = True
        finally:
            self._untxn(src, state, batch_id, done)

    def _append(self, batch_id, state: TableState, rows, lo: int) -> None:
        from delta.tables import DeltaTable

        rows = rows.dropDuplicates(list(POS))
        cond = (f"t._pgr_commit_lsn >= {lo} AND t._pgr_commit_lsn = s._pgr_commit_lsn "
                "AND t._pgr_seq = s._pgr_seq")
        values = {quote(n): f"s.{quote(n)}" for n in state.types}
        self._txn(batch_id, rows)
        done = False
        try:
            if state.empty:
                self.delta.write_first(state, rows)
            elif self.cfg.output_format == ICEBERG:
                self.delta.merge(state, rows, cond, update=None, sets={}, inserts=values)
            else:
                (DeltaTable.forPath(self.spark, state.path).alias("t").merge(rows.alias("s"), cond)
                 .whenNotMatchedInsert(values=values).execute())
            done = True
        finally:
            self._untxn(rows, state, batch_id, done)
