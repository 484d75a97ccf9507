"""``pgrouter materialize -c FILE [--available-now]``: run the Spark materializer on local Spark.

The job itself is ``actors/materialize/job.py`` (also runnable with ``spark-submit``). This
command validates the config with msgspec, supplies the Kafka/Delta jars from the dev stack's
Maven cache when the config names none (``[spark] jars`` or ``spark.jars`` in ``[spark] conf``),
and turns the job's failures into one-line errors.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile

from router.errors import ConfigError, PgRouterError


class MaterializeFailed(PgRouterError):
    """The Spark job stopped (missing schema, incompatible type change, keyless table…)."""


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", required=True, type=pathlib.Path,
                   help="materialize config (TOML; see configs/materialize.toml)")
    p.add_argument("--available-now", action="store_true",
                   help="process what is in Kafka now (Trigger.AvailableNow), then exit")
    p.add_argument("--compact", action="store_true",
                   help="Iceberg tables: compact every table of the catalog now (rewrite data "
                   "files with deletes, drop unused delete files, expire old snapshots), then exit")
    p.add_argument("--tables", action="store_true",
                   help="Iceberg tables: print each table's rows, data files, delete files and "
                   "last compaction, then exit")
    p.add_argument("--devstack-dir", default=".devstack", type=pathlib.Path,
                   help="dev stack folder whose Maven cache supplies the Spark jars when the "
                   "config names none (default .devstack)")


def run(args: argparse.Namespace) -> int:
    from actors.materialize import config

    cfg = config.load(str(args.config))
    try:
        from actors.materialize import job
        from actors.materialize.bundle import write_bundle
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(f"pyspark/delta-spark are not installed ({exc.name}); "
                          "pip install 'pgrouter[spark]'") from exc
    if not cfg.jars and "spark.jars" not in cfg.spark_conf:
        from actors.materialize.jars import spark_jars
        cfg.jars = spark_jars(args.devstack_dir)
    with tempfile.TemporaryDirectory(prefix="pgrouter-materialize-") as tmp:
        # on a cluster the executors import the job's modules (the array parser) from the
        # bundle spark-submit would ship with --py-files; local masters share this process's
        py_files = () if cfg.master.startswith("local") else (
            str(write_bundle(pathlib.Path(tmp) / "pgrouter-materialize.zip")),)
        try:
            if args.compact:
                for ref in job.compact(cfg):
                    print(f"compacted {ref}")
            if args.compact or args.tables:
                for ref, st in job.table_stats(cfg):
                    print(f"{ref}: rows={st['rows']} data_files={st['data_files']} "
                          f"delete_files={st['delete_files']} "
                          f"last_compaction={st['last_compaction'] or 'never'}")
                return 0
            job.run(cfg, available_now=args.available_now, py_files=py_files)
        except job.MaterializeError as exc:
            raise MaterializeFailed(str(exc)) from exc
    return 0
