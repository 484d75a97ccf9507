"""``pgrouter devstack up|down|status``: the embedded PostgreSQL + Kafka."""

from __future__ import annotations

import argparse
import pathlib
import sys

from actors import devstack


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
    p.add_argument("--spark", action="store_true", help="also fetch the Spark Kafka/Delta jars")


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "up":
            info = devstack.ensure_up(args.dir, pg_port=args.pg_port, kafka_port=args.kafka_port,
                                      extra_postgres=args.extra_postgres, spark=args.spark)
            print(f"postgres  {info.pg_dsn}")
            for name, dsn in info.extra_pg.items():
                print(f"{name:<9} {dsn}")
            print(f"kafka     {info.kafka_bootstrap}")
            return 0
        if args.action == "down":
            stopped = devstack.down(args.dir)
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
            return 0
        st = devstack.status(args.dir)
        if not st.get("running") and len(st) == 1:
            print("not running")
            return 3
        for name, s in st.items():
            if isinstance(s, dict):
                where = s.get("dsn") or s.get("bootstrap")
                print(f"{name:<9} {where}  {'running' if s['running'] else 'stopped'}")
        return 0 if st["running"] else 3
    except devstack.StackError as exc:
        print(f"pgrouter devstack: {exc}", file=sys.stderr)
        return 1
