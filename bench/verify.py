"""``pgrouter verify`` throughput: rows/s of verify on a table of N rows (its topic written by
the router's initial snapshot) against ``COPY (SELECT …) TO STDOUT`` of the same table to
/dev/null (psql), side by side in one run.

    python bench/verify.py [--rows 1000000] [--format json|connect|avro] [--dsn ...]
                           [--kafka ...] [--registry URL] [--repeat 3] [--old-tree DIR]
                           [--status-interval S]

A router streams the table's slot in the background (verify waits until it delivered past
its snapshot); the time measured is verify's whole run (a fresh process: catalog, snapshot,
reading and folding the topic, reading and comparing the table), and its own per-topic
duration, and its CPU seconds. The reference, measured right after each verify run: ``COPY``
of the table plus reading the whole topic once with the same client (confluent-kafka, no
decoding). ``--repeat N`` runs (default 3) interleaved; prints one JSON line with the
medians, their ratios (``verify_over_reference``: the whole run, process start included;
``compare_over_reference``: the topic's comparison) and each run; the tables, slot and
topic are dropped afterwards.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import psycopg2

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.snapshot import COLUMNS, copy_seconds  # noqa: E402


def _sql(dsn: str, statement: str):
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
            return cur.fetchall() if cur.description else None
    finally:
        conn.close()


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--format", default="json", choices=["json", "connect", "avro"])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--kafka", default="127.0.0.1:9092")
    ap.add_argument("--registry", default="http://127.0.0.1:8081/apis/ccompat/v7")
    ap.add_argument("--repeat", type=int, default=3,
                    help="verify runs (each followed by the reference's): medians printed")
    ap.add_argument("--old-tree", metavar="DIR",
                    help="also run the verify of this checkout (built) in each round, on the "
                         "same table and router: old_* figures, interleaved")
    ap.add_argument("--status-interval", type=float, default=None,
                    help="the router's [source] status_interval (default: the config's "
                         "default, what users run with)")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    for tree in filter(None, (ROOT, args.old_tree)):
        _compiled(pathlib.Path(tree))
    load = os.getloadavg()
    u = uuid.uuid4().hex[:8]
    table, slot, route = f"bench_verify_{u}", f"bench_verify_{u}", f"bv_{u}"
    topic = f"{route}.public.{table}"
    _sql(args.dsn, f"create table {table}(id int8 primary key, grp int, amount numeric(12,2), "
                   "note text, created timestamptz)")
    _sql(args.dsn, f"insert into {table} select g, g % 97, g / 100.0, 'note ' || g, "
                   f"'2026-01-01'::timestamptz + g * interval '1 second' "
                   f"from generate_series(1, {args.rows}) g")
    _sql(args.dsn, f"create publication {slot} for table {table}")
    router = None
    with tempfile.TemporaryDirectory() as tmp:
        cfg = pathlib.Path(tmp) / "router.toml"
        cfg.write_text(_router_config(args, slot, route, table))
        try:
            log = open(pathlib.Path(tmp) / "router.log", "wb")
            router = subprocess.Popen([sys.executable, "-m", "actors.cli", "run", "-c",
                                       str(cfg)], cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT)
            waited, usage, runs, res = _measure(args, cfg, router, slot, table, topic)
        finally:
            if router is not None:
                router.terminate()
                try:
                    router.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    router.kill()
                    router.wait(timeout=30)
            _drop(args, slot, table, topic)
    _print_summary(args, runs, res, load, waited, usage)


def _router_config(args, slot: str, route: str, table: str) -> str:
    """The router's configuration: the table's slot and publication, created by the router."""
    kafka = f'format = "{args.format}"\n'
    if args.format == "avro":
        kafka += f'\n[kafka.registry]\nurl = "{args.registry}"\n'
    status = ("" if args.status_interval is None
              else f"status_interval = {args.status_interval}")
    return f"""
[source]
dsn = {json.dumps(args.dsn)}
slot = {json.dumps(slot)}
publications = [{json.dumps(slot)}]
create_slot = true
{status}

[kafka]
bootstrap_servers = {json.dumps(args.kafka)}
{kafka}
[log]
progress_interval = 30

[[routes]]
name = "{route}"
tables = ["{table}"]
"""


def _measure(args, cfg: pathlib.Path, router: subprocess.Popen, slot: str, table: str,
             topic: str) -> tuple[float, int, list[dict], dict]:
    """Waits for the router's slot and a first verify (the initial snapshot), then the
    ``--repeat`` rounds: verify (each tree) and the reference, interleaved. Returns the
    first run's wait, the peak child RSS, each round's figures and the last verify's result."""
    started = time.monotonic()
    while not _sql(args.dsn, f"select 1 from pg_replication_slots where slot_name = "
                             f"'{slot}' and active"):
        if router.poll() is not None or time.monotonic() - started > 600:
            raise SystemExit("the router did not start: see its log")
        time.sleep(0.2)
    proc = subprocess.run([sys.executable, "-m", "actors.cli", "verify", "-c", str(cfg),
                           "--json", "--wait", "3600"], cwd=ROOT, capture_output=True,
                          text=True, timeout=7200)
    if proc.returncode != 0:  # the first run waits for the initial snapshot
        raise SystemExit(f"verify exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    waited = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    runs = []
    for _ in range(args.repeat):  # verify (each tree) and the reference, interleaved
        run, res = _verify(cfg, ROOT)
        if args.old_tree:
            old, _res = _verify(cfg, args.old_tree)
            run.update({f"old_{k}": v for k, v in old.items()})
        copy = copy_seconds(args.dsn, table)
        read = read_seconds(args.kafka, topic)
        run.update({"copy": copy, "read": read, "ratio": run["wall"] / (copy + read)})
        if args.old_tree:
            run["old_ratio"] = run["old_wall"] / (copy + read)
        runs.append(run)
    usage = max(usage, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return waited, usage, runs, res


def _drop(args, slot: str, table: str, topic: str) -> None:
    """The slot, publication, table and topic removed."""
    _sql(args.dsn, f"select pg_drop_replication_slot('{slot}') from "
                   f"pg_replication_slots where slot_name = '{slot}'")
    _sql(args.dsn, f"drop publication if exists {slot}")
    _sql(args.dsn, f"drop table if exists {table}")
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=args.kafka)
    if topic in admin.list_topics():
        admin.delete_topics([topic])
    admin.close()


def _print_summary(args, runs: list[dict], res: dict, load: tuple, waited: float,
                   usage: int) -> None:
    """The JSON line: the medians, their ratios and each run."""
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    reference = med["copy"] + med["read"]
    print(json.dumps({
        "rows": args.rows, "format": args.format, "compared": res["compared"],
        "equal": res["equal"], "runs": args.repeat,
        "rows_read_one_by_one": res["rows_read"], "buckets": res["buckets"],
        "buckets_differing": res["buckets_differing"],
        "verify_seconds": round(med["wall"], 2),
        "verify_compare_seconds": round(med["compare"], 2),
        "verify_cpu_seconds": round(med["cpu"], 2),
        "verify_rows_per_s": round(res["compared"] / med["wall"]),
        "copy_seconds": round(med["copy"], 3), "read_topic_seconds": round(med["read"], 3),
        "reference_seconds": round(reference, 3),
        "verify_over_reference": round(med["wall"] / reference, 2),
        "median_of_run_ratios": round(med["ratio"], 2),
        **({"old_verify_seconds": round(med["old_wall"], 2),
            "old_verify_cpu_seconds": round(med["old_cpu"], 2),
            "old_verify_over_reference": round(med["old_wall"] / reference, 2),
            "old_median_of_run_ratios": round(med["old_ratio"], 2)} if args.old_tree else {}),
        "load_average": [round(x, 1) for x in load + os.getloadavg()],
        "compare_over_reference": round(med["compare"] / reference, 2),
        "verify_over_copy": round(med["wall"] / med["copy"], 1),
        "first_run_with_snapshot_seconds": round(waited, 1),
        "peak_child_rss_mb": round(usage / 1024),
        "each": [{k: round(v, 2) for k, v in r.items()} for r in runs],
        "columns": COLUMNS,
    }))


def _compiled(tree: pathlib.Path) -> None:
    """The tree's modules byte-compiled, as an installed pgrouter's are: without it (under
    PYTHONDONTWRITEBYTECODE, or a fresh checkout) every verify run would compile them again."""
    for package in ("router", "actors"):
        compileall.compile_dir(str(tree / package), quiet=1)


def _verify(cfg: pathlib.Path, tree) -> tuple[dict, dict]:
    """One ``pgrouter verify --json`` of the tree ``tree`` (a fresh process): its wall time,
    its topic's comparison and its CPU seconds, and its result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "actors.cli", "verify", "-c", str(cfg),
                           "--json"], cwd=tree, capture_output=True, text=True, timeout=7200)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"verify ({tree}) exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    [res] = json.loads(proc.stdout)["results"]
    return {"wall": wall, "compare": res["seconds"],
            "cpu": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)}, res


def read_seconds(kafka: str, topic: str) -> float:
    """Reading the whole topic once with the client verify uses (confluent-kafka, in this
    process, in batches as verify reads), no decoding: the reference's other half."""
    from confluent_kafka import Consumer, TopicPartition

    started = time.monotonic()
    # librdkafka's fetch backoff as verify's reader sets it: with its default (1 s since 2.4)
    # a read whose loop falls behind the fetches filled the 100,000-message queue and then
    # waited most of a second, in some runs and not others (0.3 s or 1.3 s for one topic)
    consumer = Consumer({"bootstrap.servers": kafka, "group.id": "bench-verify-read",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.queue.backoff.ms": 10})
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in meta.partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end])
        left, size = sum(ends.values()), 0
        while left > 0:
            for m in consumer.consume(10_000, 1.0):
                if m.error() is None:
                    size += len(m.value() or b"")
                    left -= 1
    finally:
        consumer.close()
    return time.monotonic() - started


if __name__ == "__main__":
    main()
