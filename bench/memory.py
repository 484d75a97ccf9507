"""Peak memory of ``pgrouter run --until-caught-up`` over one huge transaction.

    .venv/bin/python bench/memory.py [--rows 2000000] [--runs librdkafka,kafka-python]
                                     [--memory-limit BYTES]

One slot per run (pgoutput) is created *before* the workload, then one transaction inserts
``--rows`` narrow rows (``id bigint primary key, n int``), far beyond ``memory_limit`` (the
default 64 MiB unless given), so the transaction is spilled to disk and read back. Each run
drains it with ``pgrouter run --until-caught-up`` and one Kafka client; the peak resident set
size of the router process (``ru_maxrss`` from ``wait4``) is printed with the time, the
records Kafka acknowledged, and the router's own figure of a process doing nothing
(``idle``: start-up and imports only) for comparison. Slots, publication, table and topics
are removed afterwards, also after a failure. ``--dsn``/``--bootstrap`` default to
``PGROUTER_TEST_DSN``/``PGROUTER_TEST_KAFKA``, else the dev stack of this checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg2  # noqa: E402

from devstack.kafka import delete_topics  # noqa: E402

CLIENTS = ("librdkafka", "kafka-python")
_ACKED = re.compile(r"records_acked=(\d+)")


def _stack_defaults() -> tuple[str, str]:
    state = ROOT / ".devstack" / "state.json"
    dsn, bootstrap = "postgresql://postgres@127.0.0.1:5432/postgres", "127.0.0.1:9092"
    if state.exists():
        st = json.loads(state.read_text())
        dsn, bootstrap = st.get("pg_dsn", dsn), st.get("kafka_bootstrap", bootstrap)
    return (os.environ.get("PGROUTER_TEST_DSN", dsn),
            os.environ.get("PGROUTER_TEST_KAFKA", bootstrap))


def sql(dsn: str, *statements, fetch: bool = False):
    conn = psycopg2.connect(dsn)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            for st in statements:
                cur.execute(st)
            return cur.fetchall() if fetch else None
    finally:
        conn.close()


def config(dsn: str, bootstrap: str, slot: str, pub: str, table: str, client: str,
           route: str, schema_topic: str, memory_limit: int | None, spill_dir: str) -> str:
    limit = f"memory_limit = {memory_limit}\n" if memory_limit is not None else ""
    return f"""
[source]
dsn = "{dsn}"
slot = "{slot}"
publications = ["{pub}"]
spill_dir = "{spill_dir}"
{limit}
[kafka]
bootstrap_servers = "{bootstrap}"
client = "{client}"
schema_topic = "{schema_topic}"
[[routes]]
name = "{route}"
tables = ["public.{table}"]
[log]
progress_interval = 5.0
"""


def peak_rss(cmd: list[str], timeout: float = 3600) -> tuple[int, float, int, str]:
    """Runs ``cmd``; returns (peak RSS bytes, seconds, exit status, stderr)."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"timed out: {cmd}")
            time.sleep(0.05)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return usage.ru_maxrss * 1024, elapsed, proc.returncode, err.read().decode(errors="replace")


def measure_one(dsn: str, bootstrap: str, client: str, rows: int,
                memory_limit: int | None) -> dict:
    """One table, one slot, one transaction of ``rows`` rows, one router run."""
    tag = uuid.uuid4().hex[:8]
    table = pub = slot = f"bench_mem_{tag}"
    route, schema_topic = f"bench-mem-{tag}", f"bench.mem.{tag}.schemas"
    topics = [schema_topic, f"{route}.public.{table}"]
    try:
        sql(dsn, f"create table {table} (id bigint primary key, n int)",
            f"create publication {pub} for table {table}",
            f"select pg_create_logical_replication_slot('{slot}', 'pgoutput')")
        sql(dsn, f"insert into {table} select g, g % 1000 from generate_series(1, {rows}) g")
        with tempfile.TemporaryDirectory() as tmp:
            cfg = os.path.join(tmp, "router.toml")
            with open(cfg, "w") as fh:
                fh.write(config(dsn, bootstrap, slot, pub, table, client, route, schema_topic,
                                memory_limit, tmp))
            rss, elapsed, code, log = peak_rss(
                [sys.executable, "-m", "actors.cli", "run", "-c", cfg, "--until-caught-up"])
        if code != 0:
            raise SystemExit(f"pgrouter failed ({code}):\n{log[-3000:]}")
        acked = _ACKED.findall(log)
        return {"rss": rss, "seconds": elapsed, "acked": int(acked[-1]) if acked else None}
    finally:
        sql(dsn, "select pg_drop_replication_slot(slot_name) from pg_replication_slots "
                 f"where slot_name = '{slot}'",
            f"drop publication if exists {pub}", f"drop table if exists {table}")
        delete_topics(bootstrap, topics, client_id="pgrouter-bench")


def idle_rss() -> int:
    """Peak RSS of a router process that only starts (``--help`` after the imports)."""
    code = ("import actors.cli.run, actors.runner.supervisor, actors.kafka.librdkafka, "
            "actors.kafka.kafka_python")
    rss, _, _, _ = peak_rss([sys.executable, "-c", code])
    return rss


def main() -> None:
    dsn, bootstrap = _stack_defaults()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--runs", default=",".join(CLIENTS))
    ap.add_argument("--memory-limit", type=int, default=None,
                    help="[source] memory_limit in bytes (default: the router's default)")
    ap.add_argument("--dsn", default=dsn)
    ap.add_argument("--bootstrap", default=bootstrap)
    args = ap.parse_args()
    runs = args.runs.split(",")
    if set(runs) - set(CLIENTS):
        raise SystemExit(f"unknown run(s): {sorted(set(runs) - set(CLIENTS))}")
    mib = 1024 * 1024
    print(f"one transaction of {args.rows:,} rows (id bigint, n int); memory_limit "
          f"{args.memory_limit if args.memory_limit is not None else 'default'}")
    print(f"  {'idle':<13} peak RSS {idle_rss() / mib:7.1f} MiB  (imports only)", flush=True)
    for client in runs:
        r = measure_one(args.dsn, args.bootstrap, client, args.rows, args.memory_limit)
        print(f"  {client:<13} peak RSS {r['rss'] / mib:7.1f} MiB  {r['seconds']:7.1f} s  "
              f"records acked {r['acked']}", flush=True)


if __name__ == "__main__":
    main()
