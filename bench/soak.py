"""A bounded soak: a steady load through the router while random faults hit it.

    python -m bench.soak --minutes 20 [--seed N] [--rate 40]

Faults, one at a time with a quiet spell between them: the router killed with SIGKILL (and
started again), its walsender terminated, the Kafka broker stopped and started, the
PostgreSQL server stopped and started. ``confirmed_flush_lsn`` is read every ~20 ms the whole
time (tests/e2e/guarantee.py). At the end the load stops, the router catches up, and the soak
checks that the topic holds every row of the table (nothing lost), that copies of a record
are byte-identical, and that no reading confirmed past what Kafka held; it prints a summary
(faults, records, duplicates, max stall). Runs on its own stack (``.devstack/soak``); not
part of ``make test``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import devstack
from tests.e2e.guarantee import (TOPIC_CONFIGS, ConfirmSampler, Load, delete_topics,
                                 max_stall, topic_size, verify, wait_for)
from tests.helpers import ROOT, Pg, kill9, run_router, start_router, unique, write_config

FAULTS = ("router-kill", "walsender-terminate", "broker-restart", "server-restart")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=float, default=10, help="transactions a second (50 rows)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    root = ROOT / ".devstack" / "soak"
    info = devstack.ensure_up(root, registry=False)
    pg = Pg(info.pg_dsn)
    name = unique("soak")
    tmp = root / "runs" / name
    cfg = prepare(pg, info, name, tmp)
    bootstrap = info.kafka_bootstrap
    sampler = ConfirmSampler(info.pg_dsn, name)
    sampler.start()
    rows = int(args.minutes * 60 * args.rate * 50 * 2)  # more than the soak can insert
    load = Load(info.pg_dsn, name, rows, rate=args.rate, batch=50)
    load.start()
    runs = 0
    proc = start_router(cfg, tmp / f"router-{runs}.log")
    faults: dict[str, int] = {f: 0 for f in FAULTS}
    started = time.time()
    end = time.monotonic() + args.minutes * 60
    try:
        while time.monotonic() < end:
            time.sleep(rng.uniform(5, 20))
            fault = rng.choice(FAULTS)
            faults[fault] += 1
            size = topic_size(bootstrap, name)
            print(f"{time.time() - started:7.1f}s  {fault}  (topic {size} records)", flush=True)
            if fault == "router-kill":
                kill9(proc)
                runs += 1
                proc = start_router(cfg, tmp / f"router-{runs}.log")
            else:
                pg = disturb(fault, rng, root, info, pg, name)
            wait_for(lambda: topic_size(bootstrap, name) > size, timeout=180,
                     what=f"the stream to resume after {fault}")
            assert proc.poll() is None, f"router exited {proc.returncode}"
        finish(args, pg, proc, sampler, load, bootstrap, name, faults, started)
        return 0
    finally:
        if proc.poll() is None:
            kill9(proc)
        sampler.stop()
        pg = Pg(info.pg_dsn)
        pg.drop_slot(name)
        pg.drop_slot(f"{name}_oracle")
        pg.run(f"drop publication if exists {name}")
        pg.run(f"drop table if exists {name}")
        pg.close()
        delete_topics(bootstrap, [name])
        devstack.down(root)


def prepare(pg: Pg, info, name: str, tmp):
    """The table, its publication, the oracle's slot and the router's slot (a first run):
    -> the router's configuration file, in ``tmp``."""
    pg.run(f"create table {name} (id bigint primary key, batch int, payload text)")
    pg.run(f"create publication {name} for table {name}")
    pg.run("select pg_create_logical_replication_slot(%s, 'test_decoding')", f"{name}_oracle")
    conf = ", ".join(f'"{k}" = "{v}"' for k, v in TOPIC_CONFIGS.items())
    tmp.mkdir(parents=True)
    cfg = write_config(tmp / "router.toml", dsn=info.pg_dsn, slot=name, publications=[name],
                       bootstrap=info.kafka_bootstrap,
                       routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                              f'topic = "{name}"\ntopic_settings = {{ partitions = 3, '
                              f'configs = {{ {conf} }} }}\n')
    run_router(cfg)
    return cfg


def disturb(fault: str, rng: random.Random, root, info, pg: Pg, name: str) -> Pg:
    """A fault other than the router's kill: the walsender terminated, or the broker or the
    PostgreSQL server stopped and started. -> the PostgreSQL connection to use next."""
    if fault == "walsender-terminate":
        pg.run("select pg_terminate_backend(active_pid) from pg_replication_slots "
               "where slot_name = %s and active_pid is not null", name)
        return pg
    service = "kafka" if fault == "broker-restart" else "pg"
    if service == "pg":
        pg.close()
    devstack.stop_service(root, service)
    time.sleep(rng.uniform(1, 5))
    devstack.ensure_up(root, registry=False)
    if service == "pg":
        pg = Pg(info.pg_dsn)
    return pg


def finish(args, pg: Pg, proc, sampler, load, bootstrap: str, name: str, faults: dict,
           started: float) -> None:
    """The load stopped, the router caught up and drained, the topic checked against the
    table; the summary printed."""
    load.rows = 0  # stop the load after its current batch
    load.join(timeout=120)
    inserted = pg.one(f"select count(*) from {name}")
    wait_for(lambda: pg.one("select confirmed_flush_lsn >= pg_current_wal_lsn() from "
                            "pg_replication_slots where slot_name = %s", name),
             timeout=300, what="the router to catch up")
    proc.terminate()
    assert proc.wait(timeout=120) == 0, "the router did not drain cleanly"
    samples = sampler.stop()
    figures = verify(pg, bootstrap, name, f"{name}_oracle", samples, rows=inserted)
    stall = max_stall(figures["all"], started, time.time())
    print(f"soak {args.minutes:g} min, seed {args.seed}: faults {sum(faults.values())} "
          f"({', '.join(f'{k} {v}' for k, v in faults.items())}); rows {inserted}; "
          f"records {figures['records']}; duplicates {figures['duplicates']}; "
          f"max stall {stall:.1f}s; confirmation readings {figures['samples']} "
          f"({figures['checked']} checked), none ahead of Kafka; topic = table: ok")


if __name__ == "__main__":
    sys.exit(main())
