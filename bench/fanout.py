"""Fan-out cost: the same backlog drained by ``pgrouter run --until-caught-up`` with 1 route
and with N filtered publication routes (default 16), side by side in one run.

Two slots are created at the same position before the workload, so both runs read exactly
the same WAL. The single route publishes everything; the N routes each take a disjoint slice
(``grp = k``) through their own publication, so both write the same number of records and
the difference is the cost of routing (planning, N filter evaluations per change).

    python bench/fanout.py [--changes 200000] [--routes 16] [--client kafka-python|librdkafka]
                           [--dsn ...] [--kafka ...]

With kafka-python (the default) both runs are bound by the client's per-record Python, so
the ratio includes kafka-python's cost of writing to N topics; ``--client librdkafka``
leaves the router's own cost of fanning out.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time
import uuid

import psycopg2

ROOT = pathlib.Path(__file__).resolve().parent.parent


def config(path: pathlib.Path, *, dsn: str, slot: str, pub: str, kafka: str, routes: str,
           client: str = "kafka-python") -> None:
    path.write_text(f"""
[source]
dsn = {json.dumps(dsn)}
slot = {json.dumps(slot)}
publications = [{json.dumps(pub)}]
[kafka]
bootstrap_servers = {json.dumps(kafka)}
client = {json.dumps(client)}
settings = {{ linger_ms = 5 }}
[log]
level = "warning"
{routes}
""")


def drain(cfg: pathlib.Path, profile: str | None = None) -> float:
    cmd = [sys.executable]
    if profile:
        cmd += ["-m", "cProfile", "-o", profile]
    cmd += ["-m", "actors.cli", "run", "-c", str(cfg), "--until-caught-up"]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"pgrouter failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--routes", type=int, default=16)
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--kafka", default="127.0.0.1:9092")
    ap.add_argument("--client", default="kafka-python", choices=["kafka-python", "librdkafka"])
    ap.add_argument("--profile", help="write cProfile output of the N-route run here")
    args = ap.parse_args()
    n, tag = args.routes, f"bf_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(args.dsn)
    conn.autocommit = True
    cur = conn.cursor()
    slots = [f"{tag}_one", f"{tag}_many"]
    table = f"{tag}_t"
    try:
        cur.execute(f"create table {table} (id int primary key, grp int not null, v int, "
                    f"note text)")
        cur.execute(f"alter table {table} replica identity full")
        cur.execute(f"create publication {tag} for table {table}")
        for k in range(n):
            cur.execute(f"create publication {tag}_{k} for table {table} where (grp = {k})")
        for s in slots:
            cur.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (s,))
        batch = 20_000
        for start in range(0, args.changes, batch):
            cur.execute(f"insert into {table} select g, g %% {n}, g * 7, 'note ' || g "
                        f"from generate_series(%s, %s) g",
                        (start, min(start + batch, args.changes) - 1))
        with tempfile.TemporaryDirectory() as tmp:
            one, many = pathlib.Path(tmp, "one.toml"), pathlib.Path(tmp, "many.toml")
            config(one, dsn=args.dsn, slot=slots[0], pub=tag, kafka=args.kafka, client=args.client,
                   routes=f"""
[[routes]]
name = "{tag}_all"
publication = "{tag}"
""")
            config(many, dsn=args.dsn, slot=slots[1], pub=tag, kafka=args.kafka, client=args.client,
                   routes="".join(f"""
[[routes]]
name = "{tag}_r{k}"
publication = "{tag}_{k}"
""" for k in range(n)))
            t_one = drain(one)
            t_many = drain(many, args.profile)
        print(f"changes={args.changes} routes=1: {t_one:.2f}s "
              f"({args.changes / t_one:,.0f} changes/s)")
        print(f"changes={args.changes} routes={n}: {t_many:.2f}s "
              f"({args.changes / t_many:,.0f} changes/s)")
        print(f"ratio {n} routes / 1 route = {t_many / t_one:.3f}")
    finally:
        for s in slots:
            cur.execute("select pg_drop_replication_slot(slot_name) from pg_replication_slots "
                        "where slot_name = %s and not active", (s,))
        cur.execute(f"drop publication if exists {tag}, "
                    + ", ".join(f"{tag}_{k}" for k in range(n)))
        cur.execute(f"drop table if exists {table}")
        conn.close()


if __name__ == "__main__":
    main()
