"""One huge streamed transaction: ``pgrouter run --until-caught-up`` vs ``pg_recvlogical``.

    .venv/bin/python bench/bigtx.py [--rows 2000000] [--repeat N]
                                    [--runs pg_recvlogical,librdkafka,librdkafka+eo,
                                            librdkafka/nostream]
                                    [--memory-limit BYTES] [--py-spy DIR]
                                    [--old-tree DIR]   # also old:<run>, from that checkout

One slot per measured run (pgoutput) is created *before* the workload, then a single
``INSERT … SELECT`` of ``--rows`` rows of ``bench/e2e.py``'s 6-column table (~200 bytes a row;
2M rows ≈ 660 MB of WAL) is committed: far beyond the server's ``logical_decoding_work_mem``,
so the server streams it to the router (protocol ≥ 2) and the router goes past its own
``memory_limit`` (the default 64 MiB unless given). Then, one after the other (with
``--repeat N``: N interleaved rounds, each on a slot of its own at the same position):

* ``pg_recvlogical --start --endpos <lsn> -f /dev/null`` of the server's version: the
  reference (proto_version=1: the walsender decodes the transaction and sends it at commit);
* ``pgrouter run --until-caught-up`` with librdkafka, at-least-once (``librdkafka``) and
  ``[kafka] exactly_once`` (``librdkafka+eo``): done when every record is acknowledged
  (acks=all; committed in the Kafka transaction) and the slot confirmed. Process start
  included.
* a router run named with ``/nostream`` (``librdkafka/nostream``, ``librdkafka+eo/nostream``)
  sets ``[source] streaming = false``: the server decodes the whole transaction first, as
  for ``pg_recvlogical``, and sends it at commit (the router then routes and produces it
  in parts while it arrives, and confirms it after its Commit: docs/delivery.md).

It prints each run's seconds, records acknowledged and peak resident set size (``ru_maxrss``
from ``wait4``), then each run's time over pg_recvlogical's of the same round and the median
(goal: <= 1.0, memory bounded by ``memory_limit``). ``--old-tree DIR`` (a worktree of an
earlier commit, with the venv and built extensions) adds ``old:<run>`` for every router run,
run from that checkout on the same backlog: an A/B in one run. ``--py-spy DIR`` samples each router run
with py-spy (``DIR/<run>-<round>.txt``, collapsed stacks; needs py-spy in the venv). Slots,
publication, table and topics are removed afterwards, also after a failure.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import psycopg2  # noqa: E402

import e2e  # noqa: E402

RECV = "pg_recvlogical"
RUNS = (RECV, "librdkafka", "librdkafka+eo", "kafka-python", "kafka-python+eo")
#: a run name ending in this asks the server not to stream (``[source] streaming = false``)
NOSTREAM = "/nostream"
_ACKED = re.compile(r"records_acked=(\d+)")


def peak_rss(cmd: list[str], cwd: pathlib.Path) -> tuple[int, float, int, str]:
    """Runs ``cmd`` in ``cwd``; returns (peak RSS bytes, seconds, exit status, stderr)."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return usage.ru_maxrss * 1024, elapsed, proc.returncode, err.read().decode(errors="replace")


def router_cmd(cfg: str, spy: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "actors.cli", "run", "-c", cfg, "--until-caught-up"]
    if spy:
        cmd = [str(pathlib.Path(sys.executable).parent / "py-spy"), "record", "-r", "200",
               "-f", "raw", "-o", spy, "--"] + cmd
    return cmd


def measure(args, run: str, rnd: int, slot: str, pub: str, table: str, endpos: str,
            route: str, schema_topic: str, tmp: str) -> tuple[float, int | None, str]:
    """One drain; returns (seconds, peak RSS bytes or None, records acknowledged)."""
    if run == RECV:
        return e2e.run_recvlogical(args.dsn, slot, pub, endpos), None, ""
    tree, _, name = run.rpartition(":")
    name, nostream = name.removesuffix(NOSTREAM), name.endswith(NOSTREAM)
    client, _, eo = name.partition("+")
    text = e2e.config(args.dsn, args.bootstrap, slot, pub, table, client, route,
                      schema_topic, 1, exactly_once=bool(eo))
    if args.memory_limit:
        text = text.replace("[kafka]", f"memory_limit = {args.memory_limit}\n\n[kafka]", 1)
    if nostream:
        text = text.replace("[kafka]", "streaming = false\n\n[kafka]", 1)
    cfg = os.path.join(tmp, f"{re.sub('[:/]', '-', run)}-{rnd}.toml")
    with open(cfg, "w") as fh:
        fh.write(text)
    spy = (os.path.join(args.py_spy, f"{re.sub('[:/]', '-', run)}-{rnd}.txt") if args.py_spy
           else None)
    root = pathlib.Path(args.old_tree) if tree else ROOT
    rss, elapsed, code, log = peak_rss(router_cmd(cfg, spy), root)
    if code != 0:  # said, and the other runs go on
        last = [line for line in log.splitlines() if "progress" not in line][-3:]
        print(f"  {run}: pgrouter failed ({code}) after {elapsed:.1f} s: {' | '.join(last)}")
        return float("nan"), rss, "failed"
    acked = _ACKED.findall(log)
    return elapsed, (None if spy else rss), acked[-1] if acked else "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--runs", default="pg_recvlogical,librdkafka,librdkafka+eo")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--memory-limit", type=int, default=None,
                    help="[source] memory_limit in bytes (default: the router's default)")
    ap.add_argument("--py-spy", metavar="DIR", help="sample the router runs with py-spy")
    ap.add_argument("--old-tree", metavar="DIR", help="also each router run from DIR")
    ap.add_argument("--dsn", default=os.environ.get(
        "PGROUTER_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--bootstrap", default=os.environ.get("PGROUTER_TEST_KAFKA",
                                                          "127.0.0.1:9092"))
    args = ap.parse_args()
    runs = args.runs.split(",")
    unknown = {run.removesuffix(NOSTREAM) for run in runs} - set(RUNS)
    if unknown:
        raise SystemExit(f"unknown run(s): {sorted(unknown)}")
    if args.old_tree:
        runs += [f"old:{run}" for run in runs if run != RECV]
    if args.py_spy:
        os.makedirs(args.py_spy, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    table = pub = f"bench_bigtx_{tag}"
    rounds = range(max(1, args.repeat))
    order = [(r, run) for r in rounds for run in runs]
    slots = {key: f"bench_bigtx_{tag}_{i}" for i, key in enumerate(order)}
    routes = {key: f"bench-bigtx-{re.sub('[+:/]', '-', key[1])}-{tag}-{key[0]}"
              for key in order if key[1] != RECV}
    schema_topic = f"bench.bigtx.{tag}.schemas"
    topics = [schema_topic, f"bench.bigtx.{tag}.definitions"]
    topics += [f"{route}.public.{table}" for route in routes.values()]
    topics += [f"{route}.progress" for route in routes.values()]
    results: dict[tuple, tuple] = {}
    try:
        e2e.sql(args.dsn, f"create table {table} (id bigint primary key, account int, "
                          "amount numeric(12,2), status text, note text, "
                          "created_at timestamptz)",
                f"create publication {pub} for table {table}")
        for slot in slots.values():
            e2e.sql(args.dsn, f"select pg_create_logical_replication_slot('{slot}', "
                              "'pgoutput')")
        t0 = time.perf_counter()
        e2e.workload(args.dsn, table, args.rows, args.rows)
        endpos = e2e.sql(args.dsn, "select pg_current_wal_lsn()::text", fetch=True)[0][0]
        work_mem = e2e.sql(args.dsn, "show logical_decoding_work_mem", fetch=True)[0][0]
        print(f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())} on "
              f"{os.cpu_count()} cores")
        print(f"one transaction of {args.rows:,} inserts ({time.perf_counter() - t0:.1f} s to "
              f"write), up to {endpos}; logical_decoding_work_mem {work_mem}; memory_limit "
              f"{args.memory_limit or 'default'}", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            for key in order:
                rnd, run = key
                results[key] = r = measure(args, run, rnd, slots[key], pub, table, endpos,
                                           routes.get(key, ""), schema_topic, tmp)
                rss = f"  peak RSS {r[1] / 2**20:6.1f} MiB" if r[1] else ""
                acked = f"  records acked {r[2]}" if r[2] else ""
                print(f"  {run:<15} {r[0]:7.2f} s  {args.rows / r[0]:10,.0f} rows/s{rss}"
                      f"{acked}  (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        for slot in slots.values():
            try:
                e2e.sql(args.dsn, "select pg_drop_replication_slot(slot_name) from "
                                  f"pg_replication_slots where slot_name = '{slot}'")
            except psycopg2.Error as exc:
                print(f"could not drop slot {slot}: {exc}", file=sys.stderr)
        e2e.sql(args.dsn, f"drop publication if exists {pub}", f"drop table if exists {table}")
        e2e.delete_topics(args.bootstrap, topics)
    report(runs, rounds, results)


def report(runs: list[str], rounds, results: dict) -> None:
    if RECV not in runs:
        return
    print("ratio to pg_recvlogical (time / its time in the same round; goal <= 1.0):")
    for run in runs:
        ratios = sorted(results[(r, run)][0] / results[(r, RECV)][0] for r in rounds
                        if results[(r, run)][0] == results[(r, run)][0])  # not failed
        if run == RECV or not ratios:
            continue
        print(f"  {run:<15} {statistics.median(ratios):5.2f}  (rounds: "
              f"{', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    main()
