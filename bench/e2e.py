"""End to end: draining one backlog with pgrouter (each Kafka client) vs ``pg_recvlogical``.

    .venv/bin/python bench/e2e.py [--changes 500000] [--txn-rows 50000] [--partitions 1]
                                  [--runs pg_recvlogical,librdkafka,kafka-python] [--repeat N]
                                  (also: --runs …,librdkafka+metrics: the metrics' cost;
                                   librdkafka+eo, kafka-python+eo: [kafka] exactly_once;
                                   librdkafka+avro, librdkafka+connect: [kafka] format,
                                   the registry from --registry)
                                  [--profile DIR]
    .venv/bin/python bench/e2e.py --quick        # 60k changes, for a smoke run

One slot per measured run is created (pgoutput) *before* the workload, so every run decodes
the same WAL from the same place. The workload inserts ``--changes`` rows of a 6-column table
(bigint key, int, numeric, text, text, timestamptz; ~200 bytes a row) in transactions of
``--txn-rows`` (below ``logical_decoding_work_mem``, so nothing is streamed or spilled).
Then, one after the other:

* ``null`` (only when asked for with ``--runs``): ``pgrouter run`` in-process with a client
  that acknowledges every record as it is handed over — the router's own cost, no Kafka;
* ``pg_recvlogical --start --endpos <lsn> -f /dev/null`` (proto_version=1): the walsender's
  own speed, the reference (Debian's for a 15 server, the 18 wheel's for the others; point
  ``--dsn`` at any dev-stack version, e.g. the ``v18`` node of ``devstack up
  --with-pg-version 18``);
* ``pgrouter run --until-caught-up`` with ``[kafka] client = "librdkafka"`` and
  ``"kafka-python"``: decode → route → encode → produce, done when every record is
  acknowledged by Kafka (acks=all) and the slot confirmed. Process start included.

A run name may carry a suffix for routes that follow the publication (``publication =``)
instead of naming the table: ``librdkafka/wal`` — publication changes taken at their WAL
position (the event trigger of ``pgrouter setup`` is installed for the bench and removed
after it; definitions messages are decoded with the changes), ``librdkafka/poll`` — the same
route polling ``pg_publication*`` instead (no trigger involved in that run's decoding): e.g.
``--runs pg_recvlogical,librdkafka/poll,librdkafka/wal`` shows what the mechanism costs.

It prints seconds, changes/s and the ratio to pg_recvlogical (time / reference time) side by
side from one run (with ``--repeat N``: N rounds of every run, interleaved, each on a slot of
its own at the same position; the ratio of each round and their median), plus the CPU
seconds the drainer process itself used (user+sys; pg_recvlogical's is small because the
walsender does its work; on a loaded machine pgrouter's changes per CPU second say more
than its wall time). ``BENCH_USAGE=1`` adds user/system CPU and minor page faults per run; ``BENCH_GC_OFF=1``, ``BENCH_GC_FREEZE=1`` and
``BENCH_GC_T0=<n>`` (generation-0 threshold) change the garbage collector of the ``null``
run, to see what it costs. ``--profile DIR`` runs pgrouter under cProfile (``DIR/<client>.prof``; the
timings then include the profiler's overhead). Slots, publication, table and topics are
removed afterwards, also after a failure.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg2  # noqa: E402

from devstack.kafka import delete_topics  # noqa: E402

RECV = "pg_recvlogical"
CLIENTS = ("librdkafka", "kafka-python")
#: pgrouter with a client that acknowledges every record at once, without Kafka: what the
#: router itself costs (slot reading, decoding, routing, encoding, the sink's bookkeeping)
NULL = "null"
#: librdkafka with the Prometheus endpoint on ([metrics] listen): what the metrics cost
METRICS = "librdkafka+metrics"
#: each client with [kafka] exactly_once = true: what Kafka transactions cost
EXACTLY_ONCE = tuple(f"{c}+eo" for c in CLIENTS)
#: librdkafka writing another record format ([kafka] format; avro with the --registry)
FORMATS = ("librdkafka+avro", "librdkafka+connect")
_ACKED = re.compile(r"records_acked=(\d+)")


def sql(dsn: str, *statements, fetch: bool = False):
    with psycopg2.connect(dsn) as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            for st in statements:
                cur.execute(st)
            return cur.fetchall() if fetch else None


def pg_recvlogical(dsn: str) -> str:
    """Debian's pg_recvlogical for a 15 server; the 18 wheel's (it talks to every version)
    for the others (the dev stack's 16/17 builds have no client programs)."""
    major = int(sql(dsn, "select current_setting('server_version_num')::int / 10000",
                    fetch=True)[0][0])
    if major == 15:
        return "/usr/lib/postgresql/15/bin/pg_recvlogical"
    from devstack import distributions

    return str(distributions.client_bindir(ROOT / ".devstack" / "cache") / "pg_recvlogical")


def workload(dsn: str, table: str, changes: int, txn_rows: int) -> None:
    """The backlog: ``changes`` inserts, a client committing every ``txn_rows`` rows (the WAL
    an OLTP client writes; slow to write for one-row transactions, one round trip each)."""
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            for start in range(1, changes + 1, txn_rows):
                end = min(changes, start + txn_rows - 1)
                cur.execute(
                    f"insert into {table} select g, g % 977, (g * 1.25)::numeric(12,2), "
                    "case when g % 3 = 0 then 'pending' else 'settled' end, "
                    "'payment for order ' || lpad(g::text, 8, '0') || ' via card ending ' "
                    "|| lpad((g % 10000)::text, 4, '0'), "
                    "timestamptz '2026-11-22 00:00:00+00' + g * interval '1 ms' "
                    f"from generate_series({start}, {end}) g")
                conn.commit()
    finally:
        conn.close()


def config(dsn: str, bootstrap: str, slot: str, pub: str, table: str, client: str,
           route: str, schema_topic: str, partitions: int, metrics: bool = False,
           follow: str = "", exactly_once: bool = False, fmt: str = "json",
           registry: str = "") -> str:
    selector = f'publication = "{pub}"' if follow else f'tables = ["public.{table}"]'
    eo = (f'exactly_once = true\ncommitted_lsn_topic = "{route}.progress"\n'
          f'transactional_id = "{route}"\n') if exactly_once else ""
    return (METRICS_SECTION if metrics else "") + f"""
[source]
dsn = "{dsn}"
slot = "{slot}"
publications = ["{pub}"]
{f'publication_changes = "{follow}"' if follow else ""}
[kafka]
bootstrap_servers = "{bootstrap}"
client = "{client}"
schema_topic = "{schema_topic}"
definitions_topic = "{schema_topic.removesuffix('schemas')}definitions"
{eo}
format = "{fmt}"
{f'[kafka.registry]{chr(10)}url = "{registry}"{chr(10)}' if fmt == "avro" else ""}
[[routes]]
name = "{route}"
{selector}
topic_settings = {{ partitions = {partitions} }}
[log]
progress_interval = 5.0
"""


METRICS_SECTION = """
[metrics]
listen = "127.0.0.1:0"
"""


def _stack_registry() -> str:
    """The dev stack's registry URL ("" when it has none)."""
    import msgspec

    from devstack import StackInfo

    state = ROOT / ".devstack" / "state.json"
    if not state.exists():
        return ""
    return msgspec.json.decode(state.read_bytes(), type=StackInfo).registry_url


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _children_usage() -> tuple[float, float, int]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime, r.ru_stime, r.ru_minflt


class NullClient:
    """The sink's client contract with no Kafka behind it: every record is acknowledged
    as it is handed over."""

    def produce(self, records, ticket, on_done):
        if records:
            on_done(ticket, None, len(records))

    def produce_sync(self, topic, key, value, timeout=60.0):
        pass

    def ensure_topics(self, specs):
        pass

    def flush(self, timeout=None):
        pass

    def close(self, timeout=10.0):
        pass

    @staticmethod
    def map_error(exc):
        return exc


def run_null_router(cfg_path: str) -> None:
    """``pgrouter run --until-caught-up`` with ``NullClient`` (in this process)."""
    import trio

    from actors.services import log
    from actors.runner.supervisor import Supervisor
    from router.config.router import load_config

    cfg = load_config(cfg_path)
    import gc
    from actors.cli.run import tune_gc
    tune_gc()  # what pgrouter run does; BENCH_GC_* below change it
    if os.environ.get("BENCH_GC_OFF"):
        gc.disable()
    if os.environ.get("BENCH_GC_FREEZE"):
        gc.freeze()
    if os.environ.get("BENCH_GC_T0"):
        gc.set_threshold(int(os.environ["BENCH_GC_T0"]), 10, 10)
    gc_time = [0.0, 0, None]  # seconds, collections, start

    def gc_clock(phase, info):
        if phase == "start":
            gc_time[2] = time.perf_counter()
        elif gc_time[2] is not None:
            gc_time[0] += time.perf_counter() - gc_time[2]
            gc_time[1] += 1

    gc.callbacks.append(gc_clock)
    log.setup(cfg.log.level, cfg.log.format)
    trio.run(Supervisor(cfg, until_caught_up=True,
                        client_factory=lambda cfg, *stream: NullClient()).run)
    print(f"gc: {gc_time[1]} collections, {gc_time[0]:.2f} s", file=sys.stderr)


def run_router(cfg_path: str, profile: str | None, null: bool = False) -> tuple[float, str]:
    cmd = [sys.executable]
    if profile:
        cmd += ["-m", "cProfile", "-o", profile]
    if null:
        cmd += [__file__, "--null-router", cfg_path]
    else:
        cmd += ["-m", "actors.cli", "run", "-c", cfg_path, "--until-caught-up"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"pgrouter failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed, proc.stderr


def run_recvlogical(dsn: str, slot: str, pub: str, endpos: str) -> float:
    cmd = [pg_recvlogical(dsn), "-d", dsn, "--slot", slot, "--start", "-o", "proto_version=1",
           "-o", f"publication_names={pub}", "--endpos", endpos, "-f", "/dev/null",
           "--no-loop"]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, timeout=1800)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--changes", type=int, default=500_000)
    ap.add_argument("--txn-rows", type=int, default=50_000)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--runs", default=",".join((RECV,) + CLIENTS))
    ap.add_argument("--quick", action="store_true", help="60k changes (a smoke run)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of every run, interleaved (the ratios are then medians)")
    ap.add_argument("--profile", metavar="DIR", help="run pgrouter under cProfile into DIR")
    ap.add_argument("--null-router", metavar="CONFIG", help=argparse.SUPPRESS)
    ap.add_argument("--dsn", default=os.environ.get(
        "PGROUTER_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--bootstrap", default=os.environ.get("PGROUTER_TEST_KAFKA",
                                                          "127.0.0.1:9092"))
    ap.add_argument("--registry", default=os.environ.get("PGROUTER_TEST_REGISTRY", ""),
                    help="the schema registry of the avro run (default: the dev stack's)")
    args = ap.parse_args()
    if not args.registry:
        args.registry = _stack_registry()
    if args.null_router:
        return run_null_router(args.null_router)
    if args.quick:
        args.changes = min(args.changes, 60_000)
        args.txn_rows = min(args.txn_rows, 20_000)
    runs = args.runs.split(",")
    unknown = {r for r in runs if r.partition("/")[0] not in {RECV, NULL, METRICS, *CLIENTS,
                                                             *EXACTLY_ONCE, *FORMATS}
               or r.partition("/")[2] not in ("", "wal", "poll")}
    if unknown:
        raise SystemExit(f"unknown run(s): {sorted(unknown)}")
    tag = uuid.uuid4().hex[:8]
    table, pub = f"bench_e2e_{tag}", f"bench_e2e_{tag}"
    rounds = range(max(1, args.repeat))
    order = [(r, run) for r in rounds for run in runs]
    slots = {key: f"bench_e2e_{tag}_{i}" for i, key in enumerate(order)}
    schema_topic = f"bench.e2e.{tag}.schemas"
    routes = {(r, run): f"bench-{run.replace('/', '-').replace('+', '-')}-{tag}-{r}"
              for r in rounds for run in runs if run != RECV}
    topics = [schema_topic] + [f"{route}.public.{table}" for route in routes.values()]
    topics += [f"{route}.progress" for (r, run), route in routes.items()
               if run.partition("/")[0] in EXACTLY_ONCE]
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    results: dict[tuple, float] = {}
    trigger = any(r.endswith("/wal") for r in runs)
    try:
        if trigger:
            from actors.services.publication_trigger import install_sql
            sql(args.dsn, *install_sql())
        sql(args.dsn, f"create table {table} (id bigint primary key, account int, "
                      "amount numeric(12,2), status text, note text, created_at timestamptz)",
            f"create publication {pub} for table {table}")
        for slot in slots.values():
            sql(args.dsn, f"select pg_create_logical_replication_slot('{slot}', 'pgoutput')")
        t0 = time.perf_counter()
        workload(args.dsn, table, args.changes, args.txn_rows)
        endpos = sql(args.dsn, "select pg_current_wal_lsn()::text", fetch=True)[0][0]
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"backlog: {args.changes} inserts into a 6-column table in transactions of "
              f"{args.txn_rows} ({time.perf_counter() - t0:.1f} s to write), up to {endpos}; "
              f"{args.partitions} partition(s)", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            for key in order:
                results[key] = measure(args, key, slots[key], pub, table, endpos, routes,
                                       schema_topic, tmp)
    finally:
        for slot in slots.values():
            try:
                sql(args.dsn, "select pg_drop_replication_slot(slot_name) from "
                              f"pg_replication_slots where slot_name = '{slot}'")
            except psycopg2.Error as exc:
                print(f"could not drop slot {slot}: {exc}", file=sys.stderr)
        sql(args.dsn, f"drop publication if exists {pub}", f"drop table if exists {table}")
        if trigger:
            from actors.services.publication_trigger import uninstall_sql
            sql(args.dsn, *uninstall_sql())
        delete_topics(args.bootstrap, topics + [f"bench.e2e.{tag}.definitions"],
                      client_id="pgrouter-bench")
    report(runs, rounds, results, args.txn_rows)


def measure(args, key: tuple, slot: str, pub: str, table: str, endpos: str, routes: dict,
            schema_topic: str, tmp: str) -> float:
    """One drain of the backlog; prints its line and returns its seconds."""
    rnd, run = key
    cpu_before = _children_cpu()
    usage_before = _children_usage()
    acked = None
    if run == RECV:
        elapsed = run_recvlogical(args.dsn, slot, pub, endpos)
    else:
        cfg = os.path.join(tmp, f"{run.replace('/', '-')}-{rnd}.toml")
        client, _, follow = run.partition("/")
        exactly_once = client in EXACTLY_ONCE
        fmt = client.split("+")[1] if client in FORMATS else "json"
        client = "librdkafka" if client in (NULL, METRICS) else client.split("+")[0]
        text = config(args.dsn, args.bootstrap, slot, pub, table, client, routes[(rnd, run)],
                      schema_topic, args.partitions, metrics=run.startswith(METRICS),
                      follow=follow, exactly_once=exactly_once, fmt=fmt,
                      registry=args.registry)
        with open(cfg, "w") as fh:
            fh.write(text)
        prof = os.path.join(args.profile, f"{run.replace('/', '-')}.prof") if args.profile else None
        elapsed, log = run_router(cfg, prof, null=run.startswith(NULL))
        found = _ACKED.findall(log)
        acked = found[-1] if found else "?"
        gc_line = re.findall(r"^gc: .*$", log, re.M)
        if gc_line and os.environ.get("BENCH_USAGE"):
            print(f"  {run}: {gc_line[-1]}")
    cpu = _children_cpu() - cpu_before
    usage = [a - b for a, b in zip(_children_usage(), usage_before)]
    if os.environ.get("BENCH_USAGE"):
        print(f"  {run}: user {usage[0]:.2f} s, sys {usage[1]:.2f} s, minor faults {usage[2]}")
    print(f"  {run:<15} {elapsed:7.2f} s  {args.changes / elapsed:10,.0f} changes/s  "
          f"cpu {cpu:6.2f} s ({args.changes / max(cpu, 1e-9):9,.0f}/cpu-s)"
          + (f"  (records acked: {acked})" if acked is not None else ""), flush=True)
    return elapsed


def goal(txn_rows: int) -> str:
    """The drain-ratio goal for librdkafka at this transaction size."""
    return "1.3" if txn_rows <= 1 else "1.15" if txn_rows <= 10 else "1.1"


def report(runs: list[str], rounds, results: dict, txn_rows: int = 50_000) -> None:
    """Each run's time over pg_recvlogical's of the same round; the median over rounds.
    Exactly-once runs also over the same client's at-least-once run."""
    for eo in EXACTLY_ONCE:
        base = eo.split("+")[0]
        ratios = sorted(results[(r, eo)] / results[(r, base)] for r in rounds
                        if (r, eo) in results and (r, base) in results)
        if ratios:
            print(f"exactly-once / at-least-once, {base}: {statistics.median(ratios):.2f}"
                  f" (goal <= 1.3; rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    for fmt in FORMATS:
        ratios = sorted(results[(r, fmt)] / results[(r, "librdkafka")] for r in rounds
                        if (r, fmt) in results and (r, "librdkafka") in results)
        if ratios:
            print(f"{fmt.split('+')[1]} / json, librdkafka: {statistics.median(ratios):.2f}"
                  + (" (goal <= 1.2)" if fmt.endswith("avro") else "")
                  + f" (rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    if RECV not in runs:
        return
    print("ratio to pg_recvlogical (time / its time in the same round; goal for librdkafka "
          f"<= {goal(txn_rows)} with {txn_rows} row(s) a transaction):")
    for run in runs:
        if run == RECV:
            continue
        ratios = sorted(results[(r, run)] / results[(r, RECV)] for r in rounds
                        if (r, run) in results and (r, RECV) in results)
        if not ratios:
            continue
        if len(ratios) == 1:
            print(f"  {run:<15} {ratios[0]:5.2f}")
        else:
            median = statistics.median(ratios)
            print(f"  {run:<15} {median:5.2f}  (median of {len(ratios)} rounds; "
                  f"{', '.join(f'{x:.2f}' for x in ratios)})")

if __name__ == "__main__":
    main()
