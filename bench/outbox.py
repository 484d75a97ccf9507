"""Outbox routes against plain row routes: the same inserts into one outbox table drained by
``pgrouter run --until-caught-up`` once through an outbox route (``[routes.outbox]``, one
event per insert) and once through a plain route of that table (one change record per
insert), in the same run.

Each round creates two slots at the same position, inserts ``--rows`` outbox rows
(Debezium's outbox table: uuid id, aggregatetype, aggregateid, type, jsonb payload) and
drains both slots, the order alternating between rounds (the plain route's topic has as
many partitions as the outbox route has topics, ``--types``: both write to as many
partitions); wall time and the router's CPU
seconds (user + system of the child) per drain. The summary is the median of the rounds and
the ratio outbox / plain of events per second (the goal is ≥ 0.9).

    python bench/outbox.py [--rows 100000] [--rounds 3] [--types 8] [--client librdkafka|kafka-python]
                           [--dsn ...] [--kafka ...] [--profile out.prof]
"""

from __future__ import annotations

import argparse
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import psycopg2

from fanout import config  # noqa: E402  (bench/fanout.py: one config writer for the benches)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def drain(cfg: pathlib.Path, profile: str | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the router) of one ``--until-caught-up`` run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    prof = ["-m", "cProfile", "-o", profile] if profile else []
    proc = subprocess.run([sys.executable, *prof, "-m", "actors.cli", "run", "-c", str(cfg),
                           "--until-caught-up"], cwd=ROOT, capture_output=True, text=True,
                          timeout=1800)
    elapsed = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"pgrouter failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def insert(cur, table: str, tag: str, rows: int, types: int) -> None:
    batch = 20_000
    for start in range(0, rows, batch):
        cur.execute(f"insert into {table} (aggregatetype, aggregateid, type, payload) "
                    f"select '{tag}_' || (g %% {types}), (g %% 1000)::text, 'OrderCreated', "
                    "jsonb_build_object('order', g, 'lines', jsonb_build_array(g, g + 1), "
                    "'note', 'an order of ' || g) from generate_series(%s, %s) g",
                    (start, min(start + batch, rows) - 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--types", type=int, default=8,
                    help="distinct aggregate types: the outbox route's topics")
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--kafka", default="127.0.0.1:9092")
    ap.add_argument("--client", default="librdkafka", choices=["kafka-python", "librdkafka"])
    ap.add_argument("--profile", help="cProfile output of the last round's outbox drain")
    args = ap.parse_args()
    tag = f"bo_{uuid.uuid4().hex[:8]}"
    table = f"{tag}_outbox"
    conn = psycopg2.connect(args.dsn)
    conn.autocommit = True
    cur = conn.cursor()
    results: dict[str, list[tuple[float, float]]] = {"outbox": [], "plain": []}
    routes = {"outbox": f'[[routes]]\nname = "{tag}_ev"\ntables = ["public.{table}"]\n'
                        f'[routes.outbox]\ntopic = "{tag}.event.{{aggregatetype}}"\n'
                        'headers = ["type"]\n',
              "plain": f'[[routes]]\nname = "{tag}_cdc"\ntables = ["public.{table}"]\n'
                       f'topic_settings = {{ partitions = {args.types} }}\n'}
    slots = {kind: f"{tag}_{kind}" for kind in routes}
    try:
        cur.execute(f"create table {table} (id uuid primary key default gen_random_uuid(), "
                    "aggregatetype varchar(255) not null, aggregateid varchar(255) not null, "
                    "type varchar(255) not null, payload jsonb)")
        cur.execute(f"create publication {tag} for table {table}")
        with tempfile.TemporaryDirectory() as tmp:
            cfgs = {}
            for kind, route in routes.items():
                cfgs[kind] = pathlib.Path(tmp, f"{kind}.toml")
                config(cfgs[kind], dsn=args.dsn, slot=slots[kind], pub=tag, kafka=args.kafka,
                       client=args.client, routes=route)
            for i in range(args.rounds):
                for s in slots.values():
                    cur.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')",
                                (s,))
                insert(cur, table, tag, args.rows, args.types)
                order = ["outbox", "plain"] if i % 2 == 0 else ["plain", "outbox"]
                for kind in order:
                    last = kind == "outbox" and i == args.rounds - 1
                    results[kind].append(drain(cfgs[kind], args.profile if last else None))
                    wall, cpu = results[kind][-1]
                    print(f"round {i + 1} {kind:6}: {wall:6.2f}s wall {cpu:6.2f}s cpu "
                          f"{args.rows / wall:9,.0f} events/s", flush=True)
                for s in slots.values():
                    cur.execute("select pg_drop_replication_slot(%s)", (s,))
                cur.execute(f"truncate {table}")
        med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
               for k, v in results.items()}
        for kind, (wall, cpu) in med.items():
            print(f"median {kind:6}: {args.rows / wall:9,.0f} events/s  {cpu:.2f} cpu s  "
                  f"({cpu / args.rows * 1e6:.1f} µs cpu/event)")
        print(f"ratio outbox/plain events/s = {med['plain'][0] / med['outbox'][0]:.3f}  "
              f"cpu = {med['outbox'][1] / med['plain'][1]:.3f}  (goal ≥ 0.9 events/s)")
    finally:
        for s in slots.values():
            cur.execute("select pg_drop_replication_slot(slot_name) from pg_replication_slots "
                        "where slot_name = %s and not active", (s,))
        cur.execute(f"drop publication if exists {tag}")
        cur.execute(f"drop table if exists {table}")
        conn.close()
        _delete_topics(args.kafka, tag)


def _delete_topics(bootstrap: str, tag: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    mine = [t for t in admin.list_topics(timeout=10).topics if t.startswith(tag)]
    for future in admin.delete_topics(mine).values() if mine else ():
        future.result(timeout=30)


if __name__ == "__main__":
    main()
