"""Materializer throughput: change records per second from a Kafka backlog into Delta.

Produces backlogs (default 500k records each: inserts of 100k keys, then updates and deletes
spread over them, as pgrouter's encoder writes them) to fresh topics of the dev stack's Kafka,
then times the materializer draining them with Trigger.AvailableNow on local[2], two drains side
by side in one session (only the drains are timed, not session start or production):

* **fresh JVM**: the session's first drain, a job's first seconds (JIT compilation and Spark's
  code generation take about half of the CPU): what a scheduled ``--available-now`` run pays
  each time it starts a JVM;
* **steady state**: a second backlog of the same shape into its own table, drained by the now
  warm JVM: the pace of a job that keeps running (the default without ``--available-now``),
  i.e. whether the materializer keeps up with the router over a busy day.

* **ceiling (plain append)**: after each steady drain, the same JSON backlog appended to a
  Delta table by a plain ``readStream.format("kafka")...writeStream.format("delta")`` of the
  records parsed as the job parses them (``ceiling_drain``: no deduplication, no MERGE), in
  the same session with the same settings and batch size, timed the same way: what Spark
  costs at all for these records. ``materializer / ceiling`` compares the medians
  (``--no-ceiling`` skips it).

``--compare KEY=VALUE[,KEY=VALUE]`` (repeatable) adds a variant: after each steady drain (and its
ceiling), the same backlog drained again into a new table with those Spark SQL settings set in
the session, so a setting is measured against the job's own settings side by side in one run
(the order of the steady drain, the ceiling and the variants rotates from run to run, as the
JIT still warms over the first drains).

``--ceiling-first`` makes the fresh JVM's drain the ceiling's (what a fresh JVM gives a plain
append at all, to hold the fresh materializer's figure against; the materializer's drains of
that run start warm): run the bench once with it and once without.

``--warmup 0`` runs the fresh drain only; ``--warmup N`` makes the first backlog N records.
``--class-archive DIR`` gives the job a class-data archive (``[spark] class_archive``): the first
run writes it when its JVM exits, later runs start from it (a scheduler's ``--available-now``
runs after the first).

``--output iceberg`` drains into Iceberg tables (``[output] format = "iceberg"``, merge-on-read,
a hadoop catalog in the run's temporary folder) and the ceiling is a plain append into an Iceberg
table; ``--output delta,iceberg`` measures both side by side in one session: each steady drain
and each ceiling once per output, each output's ratio against its own format's plain append.

``--format avro`` writes the backlogs as the router writes ``[kafka] format = "avro"`` (the same
records converted by ``router.formats.avro``, their schemas registered in the registry, whose
subjects are deleted at the end); ``--format json,avro`` measures both side by side in one session:
the fresh drain in the first format, then ``--runs`` steady drains of each format's backlog,
interleaved, each into a new table and checkpoint, reported as their median. ``--bootstrap``
and ``--registry`` use running services instead of the dev stack's.

    .venv/bin/python bench/materialize.py [--records 500000] [--batch 250000] [--mode state]
                                          [--master URL] [--warmup N] [--class-archive DIR]
                                          [--format json|avro|json,avro] [--runs N]
                                          [--no-ceiling] [--compare KEY=VALUE,...]
                                          [--output delta|iceberg|delta,iceberg]
                                          [--bootstrap HOST:PORT]
                                          [--registry URL]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import urllib.parse
import urllib.request
import pathlib
import sys
import tempfile
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from machine import cpu_of  # noqa: E402  (bench/machine.py)

from kafka import KafkaProducer  # noqa: E402
from kafka.admin import KafkaAdminClient, NewTopic  # noqa: E402

from devstack import ensure_up, spark_jars  # noqa: E402
from actors.materialize import class_archive, job  # noqa: E402
from actors.materialize.settings import RegistrySettings  # noqa: E402
from router.formats.envelope import TableEncoder, TxContext  # noqa: E402
from router.pgoutput import Relation, RelationColumn  # noqa: E402
from router.formats.schema import encode_schema  # noqa: E402


def produce(bootstrap: str, topic: str, schema_topic: str, n: int, keys: int,
            registry: str | None = None) -> None:
    """``n`` records to ``topic``: JSON, or with ``registry`` Avro as the router's sink writes
    them (``router.formats.avro``, the schemas registered there)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 2, 1), NewTopic(schema_topic, 1, 1)])
    admin.close()
    rel = Relation(1, "public", "orders", "d", (
        RelationColumn(1, "id", 20, -1), RelationColumn(0, "customer", 25, -1),
        RelationColumn(0, "amount", 1700, (12 << 16 | 2) + 4), RelationColumn(0, "qty", 23, -1),
        RelationColumn(0, "placed_at", 1184, -1), RelationColumn(0, "note", 25, -1)))
    enc = TableEncoder(rel, route="bench", db="postgres")
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=50, batch_size=512 * 1024,
                      compression_type=None, acks=1)
    k, v = encode_schema(enc.schema)
    p.send(schema_topic, key=k, value=v).get(timeout=30)
    avro = None if registry is None else Avro(registry, enc.schema)
    per_tx = 100
    for t in range(n // per_tx):
        records = []
        lsn = 0x10000000 + t * 0x10000
        tx = TxContext(xid=1000 + t, commit_lsn=lsn, end_lsn=lsn + 1, commit_time=789_000_000_000_000)
        for seq in range(per_tx):
            i = t * per_tx + seq
            key = i % keys
            if i < keys:
                op, old = "c", None
            elif i % 10 == 9:
                op, old = "d", (str(key), None, None, None, None, None)
            else:
                op, old = "u", None
            new = None if op == "d" else (str(key), f"customer {key % 977}", f"{i % 100000}.{i % 100:02d}",
                                          str(i % 50), "2026-11-01 10:00:00.123456+00",
                                          "note " * (i % 7))
            k, v = enc.encode(op, tx, lsn + seq, seq, old=old, old_is_key=True, new=new)
            records.append((topic, k, v, None))
        for _, k, v, _ in (records if avro is None else avro.convert(records)):
            p.send(topic, key=k, value=v)
    p.flush(timeout=120)
    p.close()


class Avro:
    """The router's Avro conversion (``router.formats.avro``), its schemas registered."""

    def __init__(self, url: str, schema):
        from actors.kafka.registry import RegistryClient
        from router.formats.avro import AvroFormat
        from router.config.router import RegistryConfig

        self.client = RegistryClient(RegistryConfig(url=url))
        self.format = AvroFormat()
        self.format.learn(schema)

    def convert(self, records: list) -> list:
        from router.formats.avro import SchemasNeeded

        try:
            return self.format.convert_all(records)
        except SchemasNeeded as need:
            for s in need.subjects:
                self.format.set_id(s, self.client.register(s.subject, s.schema))
            return self.format.convert_all(records)


def delete_subjects(registry: str, topics) -> None:
    """The subjects of ``topics`` (soft, then permanently: the registry is shared)."""
    for topic in topics:
        for kind in ("key", "value"):
            for suffix in ("", "?permanent=true"):
                subject = urllib.parse.quote(f"{topic}-{kind}", safe="")
                req = urllib.request.Request(f"{registry.rstrip('/')}/subjects/{subject}{suffix}",
                                             method="DELETE")
                try:
                    urllib.request.urlopen(req, timeout=10).close()
                except OSError:
                    pass


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """The backlogs' topics (each holds its records: a shared Kafka keeps them otherwise)."""
    if not topics:
        return
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics(topics)
    finally:
        admin.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (the Spark driver's JVM) and of this process
    (on a cluster the executors' CPU is not counted)."""
    own = os.times()
    return cpu_of(pid) + own.user + own.system


CEILING = "ceiling (plain append)"
#: the session's Kafka consumers outlive the drains: without this, one still polling when the
#: backlogs' topics are deleted at the end created a topic of that name again (a broker's
#: auto.create.topics.enable)
NO_AUTO_CREATE = {"kafka.allow.auto.create.topics": "false"}


def table_of(spark, cfg, ceiling: bool):
    """The drained table: the job's (``bench/public/orders``) or the ceiling's."""
    if cfg.output_format != job.ICEBERG:
        return spark.read.format("delta").load(
            f"{cfg.warehouse}/" + ("ceiling" if ceiling else "bench/public/orders"))
    from actors.materialize.iceberg import table_ref
    return spark.table(f"{cfg.iceberg_name}.bench.ceiling" if ceiling else
                       table_ref(cfg, "bench", "public", "orders"))


def ceiling_drain(spark, cfg) -> None:
    """Spark's own append ceiling: the same topic read by the same session with the same
    settings, its records parsed as the job parses them (``envelope_schema`` over the schema
    topic's columns) into the same typed columns and the position, appended to a Delta table
    by a plain ``writeStream.format("delta")``: no deduplication, no MERGE, nothing planned
    per batch. What Spark costs at all for these records."""
    from pyspark.sql import functions as F

    from actors.materialize.columns import convert, envelope_schema, image_fields
    from actors.materialize.schema_topic import read_schema_topic

    schemas = [json.loads(v) for v in read_schema_topic(spark, cfg)]
    schema = envelope_schema(image_fields(schemas))
    parsed = F.from_json(F.col("value").cast("string"), schema)
    columns = {c["name"]: c for s in schemas for c in s["columns"]}
    image = F.when(F.col("e.op") == "d", F.col("e.before")).otherwise(F.col("e.after"))
    rows = (spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", cfg.bootstrap_servers)
            .option("subscribe", ",".join(cfg.topics)).option("startingOffsets", "earliest")
            .options(**NO_AUTO_CREATE)
            .option("maxOffsetsPerTrigger", cfg.max_offsets_per_trigger).load()
            .select(parsed.alias("e"))
            .select(*[convert(image.getField(n), c).alias(n) for n, c in columns.items()],
                    F.col("e.op").alias("_pgr_op"),
                    F.col("e.source.commit_lsn").alias("_pgr_commit_lsn"),
                    F.col("e.source.seq").alias("_pgr_seq")))
    writer = (rows.writeStream.option("checkpointLocation", cfg.checkpoint)
              .trigger(availableNow=True))
    if cfg.output_format == job.ICEBERG:  # a plain append into an Iceberg table
        from actors.materialize.iceberg import register_catalog
        register_catalog(spark, cfg)
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {cfg.iceberg_name}.bench")
        writer.format("iceberg").toTable(f"{cfg.iceberg_name}.bench.ceiling").awaitTermination()
    else:
        writer.format("delta").start(f"{cfg.warehouse}/ceiling").awaitTermination()


def parse_args() -> tuple[argparse.Namespace, list[str]]:
    """The options, checked: -> (args, the backlogs' formats)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=250_000, help="max_offsets_per_trigger")
    ap.add_argument("--mode", choices=["state", "changelog"], default="state")
    ap.add_argument("--master", default="local[2]",
                    help="e.g. the spark:// URL `make spark-cluster` prints (2 workers)")
    ap.add_argument("--warmup", type=int, default=None, metavar="N",
                    help="records of the first (fresh JVM) drain: default --records; 0: only "
                         "the fresh drain")
    ap.add_argument("--class-archive", metavar="DIR",
                    help="[spark] class_archive: written by the first run, used by later ones")
    ap.add_argument("--format", default="json",
                    help="json, avro, or both side by side: json,avro (default json)")
    ap.add_argument("--runs", type=int, default=1,
                    help="steady drains of each format's backlog, interleaved (median reported)")
    ap.add_argument("--no-ceiling", dest="ceiling", action="store_false",
                    help="skip the ceiling: Spark appending the JSON backlog to Delta without "
                         "merging, drained after each steady drain (ceiling_drain)")
    ap.add_argument("--ceiling-first", action="store_true",
                    help="the fresh JVM drains the warm-up backlog as the ceiling (a plain "
                         "append) instead of the materializer: what a fresh JVM gives at all; "
                         "the materializer's drains then start in a warm JVM")
    ap.add_argument("--compare", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                    help="a variant: after each steady drain, the same backlog drained again "
                         "with these Spark SQL settings set in the session (repeatable)")
    ap.add_argument("--output", default="delta",
                    help="delta, iceberg, or both side by side: delta,iceberg (default delta)")
    ap.add_argument("--compact", action="store_true",
                    help="Iceberg: after each steady drain, a full read of the table, its "
                         "compaction, and the read again, each timed (fold_costs)")
    ap.add_argument("--bootstrap", help="a running Kafka (default: the dev stack's)")
    ap.add_argument("--registry", help="a running schema registry's Confluent-compatible API "
                    "(default: the dev stack's)")
    args = ap.parse_args()
    if args.warmup is None:
        args.warmup = args.records
    formats = args.format.split(",")
    if not set(formats) <= {"json", "avro"} or len(set(formats)) != len(formats) \
            or args.runs < 1:
        ap.error("--format: json, avro or json,avro; --runs: at least 1")
    args.output = args.output.split(",")
    if not set(args.output) <= {"delta", "iceberg"} or len(set(args.output)) != len(args.output):
        ap.error("--output: delta, iceberg or delta,iceberg")
    if args.ceiling_first and (formats[0] != "json" or not args.warmup):
        ap.error("--ceiling-first: the first format must be json, and --warmup not 0")
    try:
        args.compare = [dict(kv.split("=", 1) for kv in c.split(",")) for c in args.compare]
    except ValueError:
        ap.error("--compare: KEY=VALUE[,KEY=VALUE], e.g. spark.sql.shuffle.partitions=4")
    return args, formats


def main() -> int:
    args, formats = parse_args()
    bootstrap, registry = args.bootstrap, args.registry
    if not bootstrap or (not registry and "avro" in formats):
        info = ensure_up(ROOT / ".devstack")
        bootstrap, registry = bootstrap or info.kafka_bootstrap, registry or info.registry_url
    # name -> (format, records); the warm-up backlog is the fresh drain's
    backlogs = {f"{f}.": (f, args.records) for f in formats}
    if args.warmup:
        backlogs = {"warmup.": (formats[0], args.warmup), **backlogs}
    topics = {}
    try:
        produce_backlogs(args, bootstrap, registry, backlogs, topics)
        drains, started, archive = run_drains(args, bootstrap, registry, backlogs, topics,
                                              formats)
    finally:
        avro = [topics[name][0] for name, (fmt, _) in backlogs.items()
                if fmt == "avro" and name in topics]
        if avro:
            delete_subjects(registry, avro)
        delete_topics(bootstrap, [t for pair in topics.values() for t in pair])
    print_summary(args, drains, started, archive)
    return 0


def produce_backlogs(args, bootstrap: str, registry: str | None, backlogs: dict,
                     topics: dict) -> None:
    """Each backlog produced to fresh topics (``topics``: name -> (topic, schema topic), filled
    as they are created, for the cleanup)."""
    for name, (fmt, n) in backlogs.items():
        tag = name + uuid.uuid4().hex[:8]
        topics[name] = (f"bench.materialize.{tag}", f"bench.schemas.{tag}")
        t0 = time.perf_counter()
        produce(bootstrap, *topics[name], n, max(1, args.keys * n // args.records),
                registry if fmt == "avro" else None)
        produced = time.perf_counter() - t0
        print(f"{name}backlog ({fmt}): {n} records in {produced:.1f}s ({n / produced:,.0f} "
              "records/s produced)")


def print_summary(args, drains: dict, started: float, archive) -> None:
    """Each drain's records/s and CPU, and the drains' ratios to the ceiling."""
    print(f"session start and a first job: {started:.1f}s"
          + ("" if archive is None else " (class archive: written now, for the next runs)"
             if archive.writing else f" (class archive {archive.path})"))
    print(f"mode={args.mode} master={args.master} batch(max_offsets_per_trigger)={args.batch} "
          f"keys per {args.records} records={args.keys}")
    for what, runs in drains.items():
        n, many = runs[0][0], len(runs) > 1
        rates = [n / took for _, took, _, _ in runs]
        cpus = [cpu for _, _, cpu, _ in runs]
        rate, cpu = statistics.median(rates), statistics.median(cpus)
        print(f"{what + ':':21s} materialized {n} change records: "
              + (f"median of {len(runs)} " if many else "")
              + f"{rate:,.0f} records/s"
              + (f" ({', '.join(f'{r:,.0f}' for r in rates)})" if many else "")
              + f"; CPU {cpu:.1f}s" + (f" ({', '.join(f'{c:.1f}' for c in cpus)})" if many else "")
              + f" in the JVM and this process ({n / cpu:,.0f} records per CPU second); "
              f"{runs[-1][3]} rows in the table")
    for out in args.output:
        tag = _tag(args, out)
        ceiling = CEILING + tag
        steady = next((k for k in drains if k.startswith("steady state") and "avro" not in k
                       and k.endswith(tag)), None)
        if ceiling not in drains or not steady:
            continue
        rate = statistics.median(n / took for n, took, _, _ in drains[ceiling])
        cpu = statistics.median(c for _, _, c, _ in drains[ceiling])
        for what in [steady, *(k for k in drains if k.startswith("steady, ") and k.endswith(tag))]:
            r = statistics.median(n / took for n, took, _, _ in drains[what])
            c = statistics.median(c for _, _, c, _ in drains[what])
            print(f"{what} / {ceiling}: {rate / r:.2f}x the ceiling's wall time, "
                  f"{c / cpu:.2f}x its CPU (goal: within 1.2x)")
    print(f"load average {os.getloadavg()[0]:.2f} (CPU seconds are steadier than the wall clock "
          "on a shared machine)")


def fold_costs(spark, cfg, jvm: int, records: int) -> None:
    """An Iceberg table right after a drain: a full read of its live rows (every column, the
    delete files applied), its compaction (``Maintenance.compact``), the same read again;
    wall and CPU seconds of each, and the files before and after."""
    from actors.materialize.iceberg import table_ref, table_stats
    from actors.materialize.maintenance import Maintenance

    ref = table_ref(cfg, "bench", "public", "orders")

    def timed(what, fn):
        cpu0, t0 = cpu_seconds(jvm), time.perf_counter()
        fn()
        took, cpu = time.perf_counter() - t0, cpu_seconds(jvm) - cpu0
        st = table_stats(spark, ref)
        print(f"  {what}: {took:.2f}s, CPU {cpu:.2f}s; then {st['data_files']} data files, "
              f"{st['delete_files']} delete files, {st['rows']} rows", flush=True)

    def read():
        spark.sql(f"SELECT sum(hash(*)) FROM {ref} WHERE NOT _pgr_deleted").collect()

    timed(f"read after the drain ({records} changes)", read)
    timed(f"compaction of {records} changes", lambda: Maintenance(spark, cfg).compact(ref))
    timed("read after compaction", read)


def _tag(args, output: str) -> str:
    """A drain's label suffix naming its output (none when only Delta is measured)."""
    return "" if args.output == ["delta"] else f" [{output}]"


def job_config(args, bootstrap: str, registry: str | None, topics: dict, tmp: str, name: str,
               run: int = 0, output: str = "delta"):
    """The job's configuration for one drain of backlog ``name`` (its own table and
    checkpoint under ``tmp``; with ``output`` iceberg a catalog of its own)."""
    topic, schema_topic = topics[name]
    extra = {} if output == "delta" else dict(
        output_format=job.ICEBERG, iceberg_catalog="hadoop",
        iceberg_name=f"bench_{name.strip('.')}_{run}",  # a catalog per drain
        iceberg_warehouse=f"{tmp}/{name}{run}ice", compact_interval=None)
    return job.JobConfig(**extra, bootstrap_servers=bootstrap, topics=[topic],
                         schema_topic=schema_topic, warehouse=f"{tmp}/{name}{run}wh",
                         checkpoint=f"{tmp}/{name}{run}ck", mode=args.mode,
                         max_offsets_per_trigger=args.batch, master=args.master,
                         kafka_options=NO_AUTO_CREATE,
                         spark_conf={"spark.sql.shuffle.partitions": "2",
                                     "spark.driver.memory": "4g"},
                         jars=spark_jars(ROOT / ".devstack"),
                         class_archive=args.class_archive,
                         registry=RegistrySettings(url=registry) if registry else None)


def run_drains(args, bootstrap: str, registry: str | None, backlogs: dict, topics: dict,
               formats: list):
    """Drain the backlogs in one session: the warm-up backlog first (the fresh JVM), then each
    format's ``args.runs`` times, interleaved. -> ({what: [(records, seconds, CPU seconds,
    rows)]}, session start seconds, class archive)."""
    with tempfile.TemporaryDirectory(prefix="pgrouter-bench-") as tmp:
        def config(name, run=0, output="delta"):
            return job_config(args, bootstrap, registry, topics, tmp, name, run, output)

        t0 = time.perf_counter()
        spark = job.build_session(config(next(iter(backlogs))), archive=True)
        archive = spark._pgrouter_archive
        spark.range(1).count()  # JVM and session warm, not timed
        started = time.perf_counter() - t0
        jvm = spark.sparkContext._gateway.proc.pid

        def drain(name, run=0, ceiling=False, variant=0, conf=None, output="delta"):
            cfg = config(name, run + (1000 if ceiling else 0) + 2000 * variant
                         + (10000 if output == "iceberg" else 0), output)
            conf = conf or {}
            was = {k: spark.conf.get(k, None) for k in conf}
            for k, v in conf.items():
                spark.conf.set(k, v)
            cpu0, t0 = cpu_seconds(jvm), time.perf_counter()
            try:
                if ceiling:
                    ceiling_drain(spark, cfg)
                else:
                    job.Materializer(spark, cfg).run(available_now=True)
            finally:
                took, cpu = time.perf_counter() - t0, cpu_seconds(jvm) - cpu0
                for k, v in was.items():
                    if v is None:
                        spark.conf.unset(k)
                    else:
                        spark.conf.set(k, v)
            table = table_of(spark, cfg, ceiling)
            if args.compact and output == "iceberg" and not ceiling:
                fold_costs(spark, cfg, jvm, backlogs[name][1])
            rows = (table.filter("NOT _pgr_deleted") if args.mode == "state" and not ceiling
                    else table).count()
            return backlogs[name][1], took, cpu, rows

        side, first = len(formats) > 1, args.output[0]
        drains: dict[str, list] = {}
        if args.warmup:
            fresh = "fresh JVM, " + CEILING if args.ceiling_first else "fresh JVM"
            drains[(f"{fresh} ({formats[0]})" if side else fresh) + _tag(args, first)] = [
                drain("warmup.", ceiling=args.ceiling_first, output=first)]
            for run in range(args.runs):
                todo = []
                for out in args.output:
                    tag = _tag(args, out)
                    todo += [((f"steady state ({f})" if side else "steady state") + tag, f"{f}.",
                              0, None, out) for f in formats]
                    if args.ceiling and "json" in formats:
                        todo.append((CEILING + tag, "json.", 0, None, out))
                    todo += [("steady, " + ",".join(f"{k}={v}" for k, v in conf.items()) + tag,
                              f"{formats[0]}.", i, conf, out)
                             for i, conf in enumerate(args.compare, 1)]
                if args.compare or len(args.output) > 1:  # the JIT still warms: rotate
                    todo = todo[run % len(todo):] + todo[:run % len(todo)]
                for what, name, variant, conf, out in todo:
                    drains.setdefault(what, []).append(
                        drain(name, run, ceiling=what.startswith(CEILING), variant=variant,
                              conf=conf, output=out))
        else:
            drains["fresh JVM" + _tag(args, first)] = [drain(f"{formats[0]}.", output=first)]
        class_archive.finish(archive, spark)
        if archive is None or archive.writing is None:
            spark.stop()
    return drains, started, archive


if __name__ == "__main__":
    sys.exit(main())
