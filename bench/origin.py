"""Origin filtering cost: draining one backlog with and without an origin policy.

    .venv/bin/python bench/origin.py [--txns 6000] [--rows 3] [--repeat 2]

The backlog is ``--txns`` small transactions of ``--rows`` inserts each (origin filtering
works per transaction, so small transactions are its worst case); every other transaction
is written by a session tagged with a replication origin (``pg_replication_origin_xact_setup``),
like changes an applier brings in. One slot per measured run is created *before* the
workload, so every run decodes the same WAL. Runs, alternating, ``--repeat`` times each:

* ``any``   – no policy: the origin filter actor is not in the pipeline at all;
* ``lists`` – ``deny = ["no_such_origin*"]``: every transaction is checked, all pass
              (the same records are written as with ``any``: the pure cost of filtering);
* ``none``  – ``origin = "none"``: the replicated half is dropped (fewer records to write).

Each is ``pgrouter run --until-caught-up`` (process start included), timed to exit. Printed
side by side: wall seconds (best of the repeats), transactions/s, the ratio to ``any``, and
the router process's CPU seconds (user+sys, less sensitive to a busy machine) with its ratio.
Also
the filter's own cost per transaction, measured in-process. Everything created is removed.
"""

from __future__ import annotations

import argparse
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg2  # noqa: E402

from devstack.configs import toml  # noqa: E402
from devstack.process import run_sql as sql  # noqa: E402

POLICIES = {"any": "", "lists": '[origin]\ndeny = ["no_such_origin*"]\n',
            "none": 'origin = "none"\n'}


def workload(dsn: str, table: str, origin: str, txns: int, rows: int) -> None:
    local = psycopg2.connect(dsn)
    tagged = psycopg2.connect(dsn)
    tagged.autocommit = True
    with tagged.cursor() as cur:
        cur.execute("select pg_replication_origin_session_setup(%s)", (origin,))
    tagged.autocommit = False
    try:
        for i in range(txns):
            conn = tagged if i % 2 else local
            with conn.cursor() as cur:
                if conn is tagged:
                    cur.execute("select pg_replication_origin_xact_setup("
                                "pg_current_wal_lsn(), now())")
                cur.execute(f"insert into {table} (v) select 'row ' || g from "
                            f"generate_series(1, {rows}) g")
            conn.commit()
    finally:
        local.close()
        tagged.close()


def config(dsn: str, bootstrap: str, slot: str, table: str, topic: str, policy: str) -> str:
    return POLICIES[policy] + toml({
        "source": {"dsn": dsn, "slot": slot, "publications": [table]},
        "kafka": {"bootstrap_servers": bootstrap},
        "routes": [{"name": "b", "tables": [f"public.{table}"], "topic": topic}],
        "log": {"progress_interval": 600}})


def filter_cost(n: int = 200_000) -> float:
    """ns per transaction spent in OriginFilterActor.filter (lists policy, half tagged)."""
    from actors.pipeline.origin_filter import OriginFilterActor
    from router.stream.origins import OriginPolicy, OriginRules
    from router.pgoutput import Begin, Commit, Insert, Origin, Relation, RelationColumn
    from router.stream.relations import RelationCache
    from router.stream.transactions import TransactionAssembler

    a = TransactionAssembler(RelationCache())
    a.feed(1, Relation(1, "public", "t", "d", (RelationColumn(1, "id", 23, -1),)))
    txns = []
    for i in range(1000):
        a.feed(10, Begin(100 + i, 0, i))
        if i % 2:
            a.feed(11, Origin(5, f"node_{i % 3}"))
        a.feed(12, Insert(1, (str(i),)))
        txns += a.feed(13, Commit(0, 100 + i, 101 + i, 0))
    actor = OriginFilterActor(rules=OriginRules(OriginPolicy("lists", deny=("no_such*",)),
                                                {"b": None}), inbox=None, out=None)
    batches = [txns[i:i + 50] for i in range(0, len(txns), 50)]
    t0 = time.perf_counter()
    done = 0
    while done < n:
        for b in batches:
            actor.filter(list(b))
        done += len(txns)
    return (time.perf_counter() - t0) / done * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--txns", type=int, default=6000)
    ap.add_argument("--rows", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    from devstack import ensure_up

    info = ensure_up(ROOT / ".devstack")
    dsn, bootstrap = info.pg_dsn, info.kafka_bootstrap
    tag = uuid.uuid4().hex[:8]
    table, origin = f"bench_origin_{tag}", f"bench_origin_{tag}"
    runs = [(p, r) for r in range(args.repeat) for p in POLICIES]
    slots = {run: f"bo_{tag}_{run[0]}_{run[1]}" for run in runs}
    topics = []
    sql(dsn, f"create table {table} (id bigserial primary key, v text)",
        f"create publication {table} for table {table}",
        f"select pg_replication_origin_create('{origin}')",
        *[f"select pg_create_logical_replication_slot('{s}', 'pgoutput')"
          for s in slots.values()])
    times: dict[str, list[float]] = {p: [] for p in POLICIES}
    cpu: dict[str, list[float]] = {p: [] for p in POLICIES}
    try:
        t0 = time.monotonic()
        workload(dsn, table, origin, args.txns, args.rows)
        print(f"backlog: {args.txns} transactions x {args.rows} rows, half tagged with an "
              f"origin ({time.monotonic() - t0:.1f}s to write)")
        with tempfile.TemporaryDirectory() as tmp:
            for policy, rep in runs:
                topic = f"bench.origin.{tag}.{policy}.{rep}"
                topics.append(topic)
                cfg = pathlib.Path(tmp) / f"{policy}{rep}.toml"
                cfg.write_text(config(dsn, bootstrap, slots[(policy, rep)], table, topic, policy))
                t0 = time.monotonic()
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                proc = subprocess.run([sys.executable, "-m", "actors.cli", "run", "-c", str(cfg),
                                       "--until-caught-up"], cwd=ROOT, capture_output=True,
                                      text=True)
                elapsed = time.monotonic() - t0
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[policy].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
                if proc.returncode != 0:
                    raise SystemExit(f"{policy}: pgrouter failed:\n{proc.stderr[-3000:]}")
                times[policy].append(elapsed)
        base, cbase = min(times["any"]), min(cpu["any"])
        print(f"{'policy':<8}{'best s':>9}{'txns/s':>10}{'ratio':>8}{'cpu s':>9}{'ratio':>8}"
              "   all runs (wall)")
        for policy, ts in times.items():
            best, cbest = min(ts), min(cpu[policy])
            print(f"{policy:<8}{best:>9.2f}{args.txns / best:>10.0f}{best / base:>8.2f}"
                  f"{cbest:>9.2f}{cbest / cbase:>8.2f}   " + " ".join(f"{t:.2f}" for t in ts))
        print(f"filter cost in-process: {filter_cost():.0f} ns per transaction")
    finally:
        for s in slots.values():
            try:
                sql(dsn, f"select pg_drop_replication_slot('{s}')")
            except psycopg2.Error:
                pass
        sql(dsn, f"drop publication if exists {table}", f"drop table if exists {table}",
            f"select pg_replication_origin_drop('{origin}')")
        try:
            from kafka.admin import KafkaAdminClient

            admin = KafkaAdminClient(bootstrap_servers=bootstrap)
            existing = set(admin.list_topics())
            admin.delete_topics([t for t in topics if t in existing])
            admin.close()
        except Exception as exc:  # noqa: BLE001 — leftovers are harmless, say so
            print(f"(topics not deleted: {exc})")


if __name__ == "__main__":
    main()
