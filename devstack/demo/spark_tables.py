"""``make demo``, last step: the demo's CDC topics materialized into Delta tables by the
Spark job, printed next to the PostgreSQL tables they mirror."""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import psycopg2

from actors.kafka.survey import end_offsets
from actors.materialize import job
from actors.materialize.jars import spark_jars

TABLES = {"customers": "id", "orders": "id"}
ROUTE = "cdc"


def _end_offsets(bootstrap: str, topics: list[str]) -> str:
    """Spark ``startingOffsets`` JSON at today's end of each topic: the demo materializes only
    this run's records (the topics keep earlier runs')."""
    ends = end_offsets(bootstrap, topics)
    return json.dumps({topic: {str(p): off for p, off in parts.items()} or {"0": -2}
                       for topic, parts in ends.items()})


def starting_point(info) -> str:
    return _end_offsets(info.kafka_bootstrap, [f"demo.{ROUTE}.{t}" for t in TABLES])


def run(info, root: pathlib.Path, starting_offsets: str) -> int:
    work = root / ".devstack" / "demo-delta"
    shutil.rmtree(work, ignore_errors=True)
    cfg = job.config_from_dict({
        "kafka": {"bootstrap_servers": info.kafka_bootstrap,
                  "topics": [f"demo.{ROUTE}.{t}" for t in TABLES],
                  "starting_offsets": starting_offsets},
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"},
                  "jars": spark_jars(root / ".devstack")},
        "delta": {"warehouse": str(work / "warehouse"), "checkpoint": str(work / "checkpoint")},
    })
    print("   (starting Spark: about half a minute)")
    spark = job.build_session(cfg)
    try:
        job.run(cfg, available_now=True, spark=spark)
        conn = psycopg2.connect(info.pg_dsn)
        different = []
        for table, key in TABLES.items():
            path = job.table_path(cfg.warehouse, ROUTE, "shop", table)
            cols = user_columns(conn, "shop", table)
            # the user's columns as PostgreSQL has them: whatever _pgr_ bookkeeping columns
            # the materializer keeps beside them (now or in a later version) stay out
            delta = (spark.read.format("delta").load(path).where("not _pgr_deleted")
                     .select(*cols).orderBy(key))
            lake = [tuple(str(v) if v is not None else None for v in r) for r in delta.collect()]
            with conn.cursor() as cur:
                cur.execute(f"select {', '.join(c + '::text' for c in cols)} from shop.{table} "
                            f"order by {key}")
                pg = [tuple(r) for r in cur.fetchall()]
            same = "identical" if lake == pg else "DIFFERENT"
            if lake != pg:
                different.append(table)
            print(f"\n== shop.{table}: PostgreSQL | Delta ({path}) — {same}")
            for a, b in zip(pg + [None] * (len(lake) - len(pg)), lake + [None] * (len(pg) - len(lake))):
                print(f"  {a}  |  {b}")
        conn.close()
    finally:
        spark.stop()
    if different:
        print(f"\ndemo: the Delta tables differ from PostgreSQL: {', '.join(different)}",
              file=sys.stderr)
        return 1
    return 0


def user_columns(conn, schema: str, table: str) -> list[str]:
    """The table's columns in PostgreSQL's order (the ones a user sees with ``\\d``)."""
    with conn.cursor() as cur:
        cur.execute("select attname from pg_attribute where attrelid = %s::regclass "
                    "and attnum > 0 and not attisdropped order by attnum",
                    (f"{schema}.{table}",))
        return [r[0] for r in cur.fetchall()]
