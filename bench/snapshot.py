"""Initial snapshot throughput: rows/s of pgrouter's snapshot of a big table into Kafka
against ``COPY (SELECT …) TO STDOUT`` of the same rows to /dev/null (psql), side by side in
one run; then K tables read in parallel against K sequential COPYs.

    python bench/snapshot.py [--rows 2000000] [--tables 4] [--client librdkafka|kafka-python]
                             [--dsn ...] [--kafka ...]

The snapshot's time is the one its summary line reports (reading, routing, encoding and
Kafka's acknowledgements, from the first table started to the last record acknowledged);
slot creation and the short stream afterwards are left out. The router's peak RSS during
the one-table run shows that memory does not grow with the table.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import psycopg2

ROOT = pathlib.Path(__file__).resolve().parent.parent
COLUMNS = "id, grp, amount, note, created"


def psql() -> str:
    found = shutil.which("psql")
    if found:
        return found
    for p in sorted(pathlib.Path("/usr/lib/postgresql").glob("*/bin/psql"), reverse=True):
        return str(p)
    raise SystemExit("psql not found")


def copy_seconds(dsn: str, table: str) -> float:
    started = time.monotonic()
    with open("/dev/null", "wb") as null:
        subprocess.run([psql(), dsn, "-X", "-q", "-c",
                        f"COPY (SELECT {COLUMNS} FROM ONLY {table}) TO STDOUT"],
                       stdout=null, check=True)
    return time.monotonic() - started


def snapshot_seconds(dsn: str, kafka: str, client: str, slot: str, pub: str,
                     tables: list[str], parallel: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = pathlib.Path(tmp) / "router.toml"
        cfg.write_text(f"""
[source]
dsn = {json.dumps(dsn)}
slot = {json.dumps(slot)}
publications = [{json.dumps(pub)}]
create_slot = true
[kafka]
bootstrap_servers = {json.dumps(kafka)}
client = {json.dumps(client)}
settings = {{ linger_ms = 5 }}
[snapshot]
parallel = {parallel}
[log]
level = "info"
progress_interval = 30
[[routes]]
name = "{slot}"
tables = {json.dumps(tables)}
""")
        proc = subprocess.run([sys.executable, "-m", "actors.cli", "run", "-c", str(cfg),
                               "--until-caught-up"], cwd=ROOT, capture_output=True, text=True,
                              timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"pgrouter failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    m = re.search(r"initial snapshot: done tables=\d+ rows=(\d+) seconds=([\d.]+)", proc.stderr)
    if not m:
        raise SystemExit(f"no snapshot summary in the log:\n{proc.stderr[-3000:]}")
    return float(m.group(2)), int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--kafka", default="127.0.0.1:9092")
    ap.add_argument("--client", default="librdkafka", choices=["kafka-python", "librdkafka"])
    args = ap.parse_args()
    tag = f"bs_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(args.dsn)
    conn.autocommit = True
    cur = conn.cursor()
    big = f"{tag}_big"
    small = [f"{tag}_p{i}" for i in range(args.tables)]
    slots = []
    try:
        for t, n in [(big, args.rows)] + [(s, args.rows // args.tables) for s in small]:
            cur.execute(f"create table {t} (id bigint primary key, grp int, amount numeric(12,2),"
                        f" note text, created timestamptz)")
            cur.execute(f"insert into {t} select g, g % 100, g * 0.01, 'note ' || g, "
                        f"'2026-01-01'::timestamptz + g * interval '1 s' "
                        f"from generate_series(1, {n}) g")
            cur.execute(f"vacuum analyze {t}")
            cur.execute(f"create publication {t} for table {t}")
        copy_one = copy_seconds(args.dsn, big)
        slots.append(f"{tag}_one")
        snap_one, rows = snapshot_seconds(args.dsn, args.kafka, args.client, slots[-1], big,
                                          [big], 1)
        # the largest child so far is the router (psql stays small)
        rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        copy_many = sum(copy_seconds(args.dsn, s) for s in small)
        cur.execute(f"create publication {tag}_many for table {', '.join(small)}")
        slots.append(f"{tag}_many")
        snap_many, rows_many = snapshot_seconds(args.dsn, args.kafka, args.client, slots[-1],
                                                f"{tag}_many", small, args.tables)
        print(f"one table, {rows} rows ({args.client}):")
        print(f"  COPY to /dev/null      {copy_one:8.2f} s  {args.rows / copy_one:12,.0f} rows/s")
        print(f"  snapshot into Kafka    {snap_one:8.2f} s  {rows / snap_one:12,.0f} rows/s")
        print(f"  ratio snapshot/COPY    {snap_one / copy_one:8.2f}")
        print(f"  router max RSS         {rss_mb:8.0f} MB")
        print(f"{args.tables} tables, {rows_many} rows:")
        print(f"  sequential COPYs       {copy_many:8.2f} s  {rows_many / copy_many:12,.0f} rows/s")
        print(f"  parallel snapshot      {snap_many:8.2f} s  {rows_many / snap_many:12,.0f} rows/s")
        print(f"  ratio snapshot/COPYs   {snap_many / copy_many:8.2f}")
    finally:
        for s in slots:
            cur.execute("select pg_drop_replication_slot(slot_name) from pg_replication_slots "
                        "where slot_name = %s", (s,))
        for t in [big, *small, f"{tag}_many"]:
            cur.execute(f"drop publication if exists {t}")
            cur.execute(f"drop table if exists {t}")
        conn.close()
        try:
            from kafka import KafkaAdminClient

            admin = KafkaAdminClient(bootstrap_servers=args.kafka)
            admin.delete_topics([t for t in admin.list_topics() if t.startswith(tag)])
            admin.close()
        except Exception as exc:  # the figures are printed; leftover topics are only noise
            print(f"(topics of {tag} not deleted: {exc})")


if __name__ == "__main__":
    main()
