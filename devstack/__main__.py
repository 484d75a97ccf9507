"""``python -m devstack up|down|status``: the embedded PostgreSQL + Kafka + schema registry."""

from __future__ import annotations

import argparse
import pathlib
import sys

import devstack
from actors.services.maven import MavenError
from devstack import distributions
from devstack.kafka_cluster import KafkaCluster, existing_clusters


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--dir", default=".devstack", type=pathlib.Path,
                   help="state folder (data, logs, jar cache); default .devstack")
    p.add_argument("--pg-port", default="5432",
                   help="PostgreSQL port (default 5432; 'auto' takes the first free one)")
    p.add_argument("--kafka-port", default="9092",
                   help="Kafka port (default 9092; 'auto' takes the first free one)")
    p.add_argument("--extra-postgres", type=int, default=0, metavar="N",
                   help="also run N more PostgreSQL instances (multi-master setups)")
    p.add_argument("--pg-version", type=int, choices=distributions.VERSIONS, default=None,
                   metavar="N", help="PostgreSQL major version of the main node and its extra "
                   f"nodes: {', '.join(map(str, distributions.VERSIONS))} (default: the "
                   f"existing stack's, {distributions.DEFAULT_VERSION} for a new one)")
    p.add_argument("--with-pg-version", type=int, action="append", default=[], metavar="N",
                   choices=distributions.VERSIONS,
                   help="also run a PostgreSQL N server beside the main one (repeatable)")
    p.add_argument("--standby", action="store_true",
                   help="also run a streaming standby of the main PostgreSQL (hot_standby_feedback; "
                   "on 17+ failover slots are synchronised to it)")
    p.add_argument("--no-registry", dest="registry", action="store_false",
                   help="leave the schema registry (Apicurio, Confluent-compatible API) out")
    p.add_argument("--spark", action="store_true", help="also fetch the Spark Kafka/Delta jars")
    p.add_argument("--connect", action="store_true",
                   help="also fetch the Kafka Connect jars the tests run (worker, Debezium's JDBC "
                   "sink, Apicurio's Avro converter, FileStreamSink; needs mvn)")
    p.add_argument("--kafka-brokers", type=int, default=1, metavar="N",
                   help="also run a Kafka cluster of N KRaft nodes (replication factor "
                        "min(N, 3), min.insync.replicas one less) under DIR/kafka-cluster")
    p.add_argument("--spark-cluster", action="store_true",
                   help="also start a Spark standalone cluster (master + 2 workers) from "
                   "pyspark's distribution and print its spark:// URL")


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "up":
            info = devstack.ensure_up(args.dir, pg_port=args.pg_port, kafka_port=args.kafka_port,
                                      extra_postgres=args.extra_postgres,
                                      spark=args.spark or args.spark_cluster,
                                      pg_version=args.pg_version,
                                      versions=args.with_pg_version, standby=args.standby,
                                      registry=args.registry)
            print(f"postgres  {info.pg_dsn}  (PostgreSQL {info.pg_version})")
            for name, dsn in info.extra_pg.items():
                print(f"{name:<9} {dsn}  (PostgreSQL {info.pg_version})")
            if info.standby_pg:
                print(f"{'standby':<9} {info.standby_pg}  (PostgreSQL {info.pg_version}, "
                      "streaming standby of postgres)")
            for version, dsn in info.version_pg.items():
                print(f"{'v' + version:<9} {dsn}  (PostgreSQL {version})")
            print(f"kafka     {info.kafka_bootstrap}")
            if info.registry_url:
                print(f"registry  {info.registry_url}")
            if args.connect:
                from devstack.connect import fetch_all

                print(f"connect   {fetch_all(args.dir / 'cache')}  (plugin path)")
            if args.kafka_brokers > 1:
                cluster = KafkaCluster(args.dir, brokers=args.kafka_brokers)
                print(f"kafka-cluster {cluster.up()}")
            if args.spark_cluster:
                print(f"spark     {devstack.SparkCluster(args.dir).up()}")
            return 0
        if args.action == "down":
            stopped = devstack.down(args.dir)
            for brokers in existing_clusters(args.dir):
                stopped += KafkaCluster(args.dir, brokers=brokers).down()
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
            return 0
        st = devstack.status(args.dir)
        if not st.get("running") and len(st) == 1:
            print("not running")
            return 3
        for name, s in st.items():
            if isinstance(s, dict):
                where = s.get("dsn") or s.get("bootstrap") or s.get("url") or s.get("master")
                version = f"  PostgreSQL {s['version']}" if "version" in s else ""
                print(f"{name:<9} {where}  {'running' if s['running'] else 'stopped'}{version}")
        return 0 if st["running"] else 3
    except (devstack.StackError, MavenError) as exc:
        print(f"python -m devstack: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devstack",
                                description="start/stop the embedded PostgreSQL + Kafka "
                                "+ schema registry used by the tests, the benches and the demo")
    add_parser(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
