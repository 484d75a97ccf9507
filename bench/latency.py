"""Commit-to-consumer latency under a steady stream of single-row transactions: the router,
Kafka alone and PostgreSQL's own path alone, in the same run.

    .venv/bin/python bench/latency.py [--rate 1000] [--writers 4] [--seconds 60] [--runs 3]
                                      [--paths router,kafka,postgres] [--trace]
                                      [--client auto|librdkafka|kafka-python]
                                      [--setting linger_ms=5 ...] [--dsn …] [--bootstrap …]
                                      [--router-root DIR] [--ha]
                                      [--transaction-interval-ms N] [--together]

Each of ``--runs`` rounds measures, one after the other, three paths under the same load:

* **router**: ``--writers`` connections insert one row per transaction (autocommit), paced
  together at ``--rate`` transactions a second (open loop: each writer follows its own
  schedule, so a slow commit does not lower the offered rate), as threads of a process of
  their own apart from the consumer's; ``pgrouter run`` streams the table to a topic of its
  own; a consumer (confluent-kafka when installed, else kafka-python) reads it and measures,
  for every record, the time from the source transaction's commit (the value's
  ``source.commit_time``, the server's clock; server, router and consumer share this
  machine's clock) to the moment the consumer has it. Each record's CreateTime (set by the
  router's producer when it is handed the record, in milliseconds) splits that into
  *commit -> the router's produce call* (PostgreSQL's walsender and the router) and
  *produce call -> consumer* (the producer's ``linger.ms``, the broker and the consumer).
  The run fails unless every row written arrived. The router's CPU and wake-ups (voluntary
  context switches) per transaction while the writers ran are printed by thread kind (its
  trio thread, librdkafka's threads, the rest), its start and drain left out.
* **kafka** (Kafka alone, librdkafka only): the same rate of records of the same shape and
  size produced to a new topic by a process of its own with the router's librdkafka settings
  (``actors.kafka.librdkafka.DEFAULTS`` and the ``--setting`` entries, acks=all,
  idempotence, a poll thread), each record stamped with the time it is handed to the
  producer, and read by the same consumer: what the broker, the producer's linger and the
  consumer cost on this machine, with no PostgreSQL and no router.
* **postgres** (PostgreSQL's own path alone): the same writers, no router; ``pg_recvlogical``
  of the server's version reads a ``test_decoding`` slot with ``include-timestamp`` and each
  COMMIT line's arrival minus its commit timestamp is the latency: the commit, the
  walsender's decoding and its send, with no Kafka.

``--together`` runs Kafka alone and PostgreSQL alone at the same time instead of one after
the other: the router's path has the writers, the walsender, the broker and the consumer on
the machine at once, and so does each of the other two then. The first ``--warmup`` seconds
of each load are left out. Every path prints p50, p90, p99,
p99.9 and max; the summary gives the median of each over the rounds and the issue's goal
(router max <= the worse of the two other paths' maxima + 20 ms, router p99 <= Kafka alone's +
5 ms). ``--trace`` runs the router under ``bench/latency_trace.py`` (long trio task steps,
late I/O waits and garbage collections, wall-clock stamped) and prints those lines next to
the router's slowest records, as it does the Kafka broker's GC pauses (``bench/broker_gc.py``,
also summed per Kafka path). Table, publication, slots and topics are removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from machine import cpu_of, threads_of  # noqa: E402  (bench/machine.py)

from bench.broker_gc import BrokerGC, broker_pid, said  # noqa: E402
from bench.e2e import delete_topics, sql  # noqa: E402
from bench.latency_paths import (  # noqa: E402
    Consumer, drop_slot, kafka_alone, postgres_alone, warm_ids, write)

def config(dsn: str, bootstrap: str, slot: str, pub: str, table: str, client: str,
           topic: str, prefix: str, settings: dict[str, str], extra_toml: str = "",
           kafka_toml: str = "") -> str:
    extra = "".join(f"{k} = {v}\n" for k, v in settings.items())
    return f"""
[source]
dsn = "{dsn}"
slot = "{slot}"
create_slot = true
publications = ["{pub}"]
[kafka]
bootstrap_servers = "{bootstrap}"
client = "{client}"
schema_topic = "{prefix}.schemas"
definitions_topic = "{prefix}.definitions"
{kafka_toml}
[kafka.settings]
{extra}
[[routes]]
name = "{prefix}"
tables = ["public.{table}"]
topic = "{topic}"
[log]
progress_interval = 5.0
{extra_toml}"""


def pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def figures(lat_s) -> dict[str, float]:
    """p50/p90/p99/p99.9/max (ms) of latencies in seconds."""
    ms = sorted(v * 1000 for v in lat_s)
    return {"p50": pct(ms, 50), "p90": pct(ms, 90), "p99": pct(ms, 99),
            "p99.9": pct(ms, 99.9), "max": ms[-1], "n": len(ms)}


def line(name: str, f: dict | None) -> str:
    if f is None:
        return f"  {name:<16} failed"
    return (f"  {name:<16} p50 {f['p50']:6.1f}  p90 {f['p90']:6.1f}  p99 {f['p99']:6.1f}  "
            f"p99.9 {f['p99.9']:6.1f}  max {f['max']:6.1f}  ({f['n']} records)")


def start_router(args, cfg: pathlib.Path, log, trace: pathlib.Path | None):
    env = dict(os.environ, PYTHONPATH=args.router_root)
    cmd = [sys.executable, "-m", "actors.cli", "run", "-c", str(cfg)]
    if trace is not None:
        env["TRACE_LOG"] = str(trace)
        cmd[1:3] = [str(ROOT / "bench" / "latency_trace.py")]
    return subprocess.Popen(cmd, cwd=args.router_root, stderr=log, stdout=log, env=env)


def stop_router(router) -> None:
    if router is not None and router.poll() is None:
        router.send_signal(signal.SIGTERM)
        try:
            router.wait(30)
        except subprocess.TimeoutExpired:
            router.kill()
            router.wait()


def wait_started(args, router, log, slot: str, table: str, consumer) -> str:
    """Until the router streams and a first row arrived; the client it names."""
    deadline = time.time() + 60
    while not sql(args.dsn, "select 1 from pg_replication_slots where slot_name = "
                  f"'{slot}' and active", fetch=True):
        if router.poll() is not None or time.time() > deadline:
            log.seek(0)
            raise SystemExit(f"router did not start:\n{log.read()[-3000:]}")
        time.sleep(0.2)
    sql(args.dsn, f"insert into {table} values (-1, 'warm-up')")
    consumer.start()  # the first row creates the topic; the consumer starts once it exists
    while -1 not in consumer.seen:
        if consumer.error or router.poll() is not None or time.time() > deadline:
            log.seek(0)
            raise SystemExit(f"first row never arrived ({consumer.error!r}):\n"
                             f"{log.read()[-3000:]}")
        time.sleep(0.05)
    client_line = next((ln for ln in open(log.name) if "kafka_client=" in ln), "")
    return client_line.split("kafka_client=")[1].split()[0] if client_line else "?"


def router_path(args, settings: dict, names: dict, tmp: pathlib.Path, trace) -> dict:
    """The router's run: {"lat", "at", "split", "cpu", "client", "rate"}."""
    cfg = tmp / "router.toml"
    cfg.write_text(config(args.dsn, args.bootstrap, names["slot"], names["pub"],
                          names["table"], args.client, names["topic"], names["prefix"],
                          settings, "[ha]\nenabled = true\n" if args.ha else "",
                          "" if args.transaction_interval_ms is None else
                          f"transaction_interval_ms = {args.transaction_interval_ms}"))
    consumer = Consumer(args.bootstrap, names["topic"])
    router = None
    try:
        with open(tmp / "router.log", "w+") as log:
            router = start_router(args, cfg, log, trace)
            client = wait_started(args, router, log, names["slot"], names["table"], consumer)
            before = threads_of(router.pid)
            written, _, took = write(args, names["table"], 0)
            loaded = per_transaction(router.pid, before, threads_of(router.pid),
                                     len(written))
            deadline = time.time() + 60
            while any(r not in consumer.seen for r in written[-200:]) or \
                    len(consumer.seen) < len(written) + 1:
                if time.time() > deadline or consumer.error:
                    break
                time.sleep(0.1)
            consumer.stop.set()
            consumer.join(10)
            cpu = cpu_of(router.pid)
    finally:
        consumer.stop.set()
        stop_router(router)
        drop_slot(args.dsn, names["slot"])
    if consumer.error:
        raise SystemExit(f"consumer failed: {consumer.error!r}")
    missing = [r for r in written if r not in consumer.seen]
    if missing:
        raise SystemExit(f"{len(missing)} of {len(written)} rows never arrived "
                         f"(e.g. id {missing[0]})")
    warm = warm_ids(args, 0)
    keep = [r for r in written if r not in warm]
    return {"lat": {r: consumer.seen[r] for r in keep},
            "at": {r: consumer.at[r] for r in keep},
            "split": {r: consumer.split[r] for r in keep if r in consumer.split},
            "cpu": cpu, "client": client, "rate": len(written) / took, "loaded": loaded}


def per_transaction(pid: int, before: dict, after: dict, txns: int) -> str:
    """The router's CPU and wake-ups per transaction while the writers ran (its start and
    its drain left out), by thread kind: the trio thread (its id is the pid), librdkafka's
    threads (``rdk:``), the rest (the delivery poll thread, worker threads)."""
    kinds: dict[str, list[float]] = {}
    for tid, (name, cpu, switches) in after.items():
        _, cpu0, switches0 = before.get(tid, (name, 0.0, 0))
        kind = ("trio" if tid == pid else "librdkafka" if name.startswith("rdk:")
                else "other")
        k = kinds.setdefault(kind, [0.0, 0])
        k[0] += cpu - cpu0
        k[1] += switches - switches0
    total = sum(k[0] for k in kinds.values())
    parts = ", ".join(f"{kind} {cpu / txns * 1000:.3f} ms and {n / txns:.2f} wake-ups"
                      for kind, (cpu, n) in sorted(kinds.items()))
    return (f"{total:.1f} CPU s under load, {total / max(txns, 1) * 1000:.3f} ms per "
            f"transaction ({parts} per transaction)")


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}"


def slowest(result: dict, trace: pathlib.Path | None, gc: BrokerGC | None, count=5) -> None:
    """The router's slowest records: when, split at the produce call, and what the trace
    and the broker's GC pauses recorded from their commit to their arrival."""
    lat, at, split = result["lat"], result["at"], result["split"]
    events = [(t, f"broker GC pause {s * 1000:.0f} ms (seen by then)")
              for t, s in (gc.pauses if gc is not None else [])]
    if trace is not None and trace.exists():
        for ln in trace.read_text().splitlines():
            stamp, _, rest = ln.partition(" ")
            events.append((float(stamp), rest))
    events.sort()
    for rid in sorted(lat, key=lat.get, reverse=True)[:count]:
        arrived = at[rid]
        committed = arrived - lat[rid]
        parts = split.get(rid)
        how = (f"commit -> produce call {parts[0] * 1000:.0f} ms, produce call -> consumer "
               f"{parts[1] * 1000:.0f} ms" if parts else "")
        print(f"    slow: id {rid} {lat[rid] * 1000:.1f} ms, committed at {clock(committed)} "
              f"UTC; {how}")
        for stamp, text in events:
            if committed - 0.05 <= stamp <= arrived:
                print(f"      {stamp - committed:+.3f} s  {text}")


def machine_paths(args, settings: dict, names: dict, paths: list[str], gc) -> dict:
    """Kafka alone and PostgreSQL alone: one after the other, or (``--together``) at the
    same time, so each runs under the other's load as the router's path runs under both."""
    out: dict = {}

    def kafka() -> None:
        alone = kafka_alone(args, settings, f"{names['prefix']}.alone", Consumer)
        out["kafka"] = {"lat": alone} if alone else None
        print(line("Kafka alone", figures(alone.values()) if alone else None))

    def postgres() -> None:
        pg = postgres_alone(args, names["table"], f"{names['slot']}_pg", 500_000_000)
        out["postgres"] = {"lat": pg[0], "at": pg[1]} if pg else None
        print(line("PostgreSQL alone", figures(pg[0].values()) if pg else None))

    began = time.time()
    if args.together and "kafka" in paths:
        side = threading.Thread(target=kafka)
        side.start()
        if "postgres" in paths:
            postgres()
        side.join()
    else:
        if "kafka" in paths:
            kafka()
            said(gc, began)
        if "postgres" in paths:
            postgres()
    if args.together:
        said(gc, began)
    return out


def one_round(args, settings: dict, paths: list[str]) -> dict:
    tag = uuid.uuid4().hex[:8]
    names = {"table": f"lat_{tag}", "pub": f"lat_{tag}", "slot": f"lat_{tag}",
             "prefix": f"bench.latency.{tag}"}
    names["topic"] = f"{names['prefix']}.rows"
    sql(args.dsn, f"create table {names['table']} (id bigint primary key, payload text)",
        f"create publication {names['pub']} for table {names['table']}")
    out: dict = {}
    gc = BrokerGC.start_for(broker_pid(args.broker_pid))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            trace = pathlib.Path(args.trace).resolve() if args.trace else None
            if trace is not None:
                trace.write_text("")  # this round's lines only
            if "router" in paths:
                began = time.time()
                out["router"] = router_path(args, settings, names, pathlib.Path(tmp), trace)
                r = out["router"]
                print(f"  router: client {r['client']}, achieved {r['rate']:.0f} txn/s, "
                      f"{r['cpu']:.1f} CPU s (its whole run); {r['loaded']}")
                print(line("router", figures(r["lat"].values())))
                for i, name in enumerate(("commit->produce", "produce->consumer")):
                    part = [s[i] for s in r["split"].values()]
                    if part:
                        print(line(name, figures(part)))
                said(gc, began)
                slowest(r, trace, gc)
            out.update(machine_paths(args, settings, names, paths, gc))
    finally:
        said(gc, None)  # stops it
        sql(args.dsn, f"drop publication if exists {names['pub']}",
            f"drop table if exists {names['table']}")
        p = names["prefix"]
        delete_topics(args.bootstrap, [names["topic"], f"{p}.schemas", f"{p}.definitions",
                                       f"{p}.alone", f"pgrouter.{names['slot']}.leader"])
    return out


def summary(rounds: list[dict]) -> None:
    print(f"median over {len(rounds)} rounds (ms):")
    med = {}
    for path, name in (("router", "router"), ("kafka", "Kafka alone"),
                       ("postgres", "PostgreSQL alone")):
        figs = [figures(r[path]["lat"].values()) for r in rounds if r.get(path)]
        if figs:
            med[path] = {k: statistics.median(f[k] for f in figs) for k in figs[0]}
            maxima = ", ".join(f"{f['max']:.0f}" for f in figs)
            print(line(name, med[path]) + f"  [max per round: {maxima}]")
    if "router" in med and "kafka" in med:
        worse = max(med["kafka"]["max"], med.get("postgres", {"max": 0})["max"])
        print(f"goal: router max {med['router']['max']:.1f} <= {worse + 20:.1f} (worse path's "
              f"max + 20): {'met' if med['router']['max'] <= worse + 20 else 'NOT met'}; "
              f"router p99 {med['router']['p99']:.1f} <= {med['kafka']['p99'] + 5:.1f} "
              f"(Kafka alone + 5): "
              f"{'met' if med['router']['p99'] <= med['kafka']['p99'] + 5 else 'NOT met'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=1000.0, help="transactions a second, total")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=60.0, help="load duration of each path")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds left out of the figures")
    ap.add_argument("--runs", type=int, default=3, help="rounds of every path")
    ap.add_argument("--paths", default="router,kafka,postgres",
                    help="which of router, kafka (Kafka alone), postgres (pg_recvlogical)")
    ap.add_argument("--trace", nargs="?", metavar="FILE",
                    const=str(pathlib.Path(tempfile.gettempdir()) / "latency-trace.log"),
                    help="the router under bench/latency_trace.py, its lines in FILE (each "
                         "round's replaces the one before): long task steps, late I/O waits, "
                         "GC pauses, commits received late, printed next to the slowest records")
    ap.add_argument("--client", default="auto", choices=["auto", "librdkafka", "kafka-python"])
    ap.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                    help="a [kafka.settings] entry (TOML value), e.g. linger_ms=5")
    ap.add_argument("--ha", action="store_true",
                    help="[ha] enabled (one router: what the producer fence costs, docs/ha.md)")
    ap.add_argument("--transaction-interval-ms", type=int, default=None,
                    help="[kafka] transaction_interval_ms (exactly-once or --ha)")
    ap.add_argument("--broker-pid", type=int, default=None,
                    help="the Kafka broker's JVM, whose GC pauses (jstat) are printed next to "
                         "the paths (default: the dev stack's)")
    ap.add_argument("--together", action="store_true",
                    help="Kafka alone and PostgreSQL alone at the same time, each under the "
                         "other's load (the router's path runs under both)")
    ap.add_argument("--no-ceiling", action="store_true", help="the same as --paths router")
    ap.add_argument("--dsn", default=os.environ.get(
        "PGROUTER_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--bootstrap", default=os.environ.get("PGROUTER_TEST_KAFKA",
                                                          "127.0.0.1:9092"))
    ap.add_argument("--router-root", default=str(ROOT), metavar="DIR",
                    help="the checkout whose pgrouter run is measured (another commit's, to "
                         "compare; its C module built)")
    args = ap.parse_args()
    settings = dict(s.split("=", 1) for s in args.setting)
    paths = ["router"] if args.no_ceiling else args.paths.split(",")
    if args.client == "kafka-python" and "kafka" in paths:
        paths.remove("kafka")  # Kafka alone is librdkafka's
    print(f"{args.rate:.0f} one-row txn/s offered by {args.writers} writers, "
          f"{args.seconds:.0f} s per path, first {args.warmup:.0f} s left out; "
          f"settings {settings or 'default'}; load average {os.getloadavg()[0]:.2f}")
    rounds = []
    for n in range(args.runs):
        print(f"round {n + 1} (load average {os.getloadavg()[0]:.2f}):")
        rounds.append(one_round(args, settings, paths))
    summary(rounds)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
