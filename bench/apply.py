"""``pgrouter apply`` against PostgreSQL's own apply worker, on the same changes.

    .venv/bin/python bench/apply.py [--rows 200000] [--txn-rows 1000] [--updates 50000]
                                    [--rounds 2] [--profile FILE] [--group-rows N]
                                    [--stack DIR]

One source database (dev-stack node ``pg2``) with a six-column table. Before any write, one
slot for the router and one per round for native subscriptions are created, so every
contender reads the same changes. The workload: ``--rows`` inserts in ``--txn-rows``-row
transactions (phase "inserts"), then ``--updates`` one-row update transactions (phase
"updates"). The router (``pgrouter run --until-caught-up``, librdkafka, with the
transaction topic) puts them into Kafka once, untimed.

Each round, in alternating order: a native subscription (``copy_data = false``, its own
slot) into a fresh database on node ``pg3``, and ``pgrouter apply --until-caught-up`` into
another fresh database there (a new origin: it reads the topics from the beginning), with
the default configuration; with ``--group-rows N`` also ``pgrouter apply`` with ``[target]
group_rows = N`` (``--group-rows 1``: a target transaction per source transaction). All
are timed the same way: the target's replication origin progress is polled; a phase runs
from the first commit seen (inserts) or the end of the previous phase (updates) to its last
transaction's commit. Both targets are checked equal to the source. Printed: rows/s and
transactions/s per phase and contender, the ratio pgrouter/native (best round each; and
each round's time over native's time in that round), the
applier's CPU per row (user+sys of its process, per phase) and its peak RSS, and the target
server's CPU per row for each (the apply worker's process, the applier's backend): a
figure a busy machine disturbs less than the wall-clock ratio. After each pgrouter round,
``pgrouter apply --until-caught-up`` runs again on its target with nothing left to apply:
the fixed cost of a start (process, connections, topics' ends, exit). Medians over the
rounds are printed beside the best. Everything created is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import uuid
from statistics import median

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from machine import cpu_of  # noqa: E402  (bench/machine.py)

import psycopg2  # noqa: E402

from devstack.configs import toml  # noqa: E402
from devstack.process import query as sql  # noqa: E402

TABLE = ("create table t (id int primary key, a int not null, b text, c numeric(14,2), "
         "d timestamptz, e boolean)")


def with_db(server: str, db: str) -> str:
    return server.rpartition("/")[0] + "/" + db


def fingerprint(dsn: str) -> str:
    return sql(dsn, "select count(*) || ':' || md5(coalesce(string_agg(t::text, ',' order by id), "
                    "'')) from t", fetch=True)[0][0]


class Progress:
    """Polls a target's origin progress; records when it first moves and when it reaches
    each threshold."""

    def __init__(self, dsn: str, query: str):
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        self.query = query

    def value(self) -> int:
        with self.conn.cursor() as cur:
            cur.execute(self.query)
            row = cur.fetchone()
            return int(row[0]) if row and row[0] is not None else 0

    def wait(self, threshold: int, timeout: float, on_tick=None) -> float:
        deadline = time.monotonic() + timeout
        while self.value() < threshold:
            if on_tick is not None:
                on_tick()
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for progress {threshold}")
            time.sleep(0.005)
        return time.monotonic()

    def close(self):
        self.conn.close()


def transaction_ends(bootstrap: str, topic: str) -> list[dict]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False})
    try:
        tp = TopicPartition(topic, 0, 0)
        high = c.get_watermark_offsets(tp, timeout=10)[1]
        c.assign([tp])
        out, seen = [], 0
        while seen < high:
            for m in c.consume(10000, 1.0):
                if m.error():
                    continue
                seen = m.offset() + 1
                v = json.loads(m.value())
                if v["status"] == "END":
                    out.append(v)
        return out
    finally:
        c.close()


def run_native(src_dsn: str, server: str, slot: str, a_end: int, b_end: int, tag: str) -> dict:
    db = f"bapply_n_{tag}"
    sql(server, f"create database {db}")
    dsn = with_db(server, db)
    sub = f"sub_{tag}"
    try:
        sql(dsn, TABLE)
        sql(dsn, f"create subscription {sub} connection '{src_dsn}' publication pub with "
                 f"(slot_name = '{slot}', create_slot = false, copy_data = false, "
                 "enabled = false)")
        prog = Progress(dsn, "select s.remote_lsn - '0/0'::pg_lsn from "
                             "pg_replication_origin_status s join pg_subscription p on "
                             "s.external_id = 'pg_' || p.oid where p.subname = "
                             f"'{sub}'")
        t0 = time.monotonic()
        sql(dsn, f"alter subscription {sub} enable")
        first = prog.wait(1, 120)
        worker = sql(dsn, "select pid from pg_stat_subscription where subname = %s and "
                          "relid is null", sub, fetch=True)[0][0]
        s0 = cpu_of(worker)
        t_a = prog.wait(a_end, 600)
        s_a = cpu_of(worker)
        t_b = prog.wait(b_end, 600)
        s_b = cpu_of(worker)
        prog.close()
        return {"start": t0, "first": first, "a": t_a, "b": t_b, "fp": fingerprint(dsn),
                "server_a": s_a - s0, "server_b": s_b - s_a}
    finally:
        sql(dsn, f"alter subscription {sub} disable")
        sql(dsn, f"alter subscription {sub} set (slot_name = none)")
        sql(dsn, f"drop subscription {sub}")
        sql(server, f"drop database {db}")


def run_pgrouter(server: str, bootstrap: str, tx_topic: str, prefix: str, a_end: int,
                 b_end: int, tag: str, profile: str | None, group_rows: int = 0) -> dict:
    db = f"bapply_p_{tag}"
    sql(server, f"create database {db}")
    dsn = with_db(server, db)
    origin = f"bench_{tag}"
    cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    cfg.write(toml({"kafka": {"bootstrap_servers": bootstrap, "transactions_topic": tx_topic,
                              "topics": [f"{prefix}.*"]},
                    "target": {"dsn": dsn, "origin": origin, "group_rows": group_rows or None},
                    "log": {"progress_interval": 600}}))
    cfg.close()
    try:
        sql(dsn, TABLE)
        sql(dsn, "select pg_replication_origin_create(%s)", origin)
        prog = Progress(dsn, f"select pg_replication_origin_progress('{origin}', false) - "
                             "'0/0'::pg_lsn")
        cmd = [sys.executable, "-m", "actors.cli", "apply", "-c", cfg.name, "--until-caught-up"]
        if profile:
            cmd = [sys.executable, "-m", "cProfile", "-o", profile, "-m", "actors.cli", "apply",
                   "-c", cfg.name, "--until-caught-up"]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)

        def alive():
            if proc.poll() is not None and proc.returncode != 0:
                raise SystemExit(f"pgrouter apply failed:\n{proc.stderr.read()[-3000:]}")
        while prog.value() == 0:
            alive()
            time.sleep(0.005)
        first = time.monotonic()
        backend = sql(dsn, "select pid from pg_stat_activity where datname = %s and "
                           "application_name = 'pgrouter'", db, fetch=True)[0][0]
        s0 = cpu_of(backend)
        t_a = prog.wait(a_end, 600, alive)
        cpu_a = cpu_of(proc.pid)
        s_a = cpu_of(backend)
        t_b = prog.wait(b_end, 600, alive)
        cpu_b = cpu_of(proc.pid)
        s_b = cpu_of(backend)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read()
        if proc.returncode != 0:
            raise SystemExit(f"pgrouter apply exited {proc.returncode}:\n{err[-3000:]}")
        prog.close()
        t_idle = time.monotonic()  # again, with nothing left to apply
        again = subprocess.run(cmd[:1] + ["-m", "actors.cli", "apply", "-c", cfg.name,
                                          "--until-caught-up"], cwd=ROOT, capture_output=True)
        idle = time.monotonic() - t_idle
        if again.returncode != 0:
            raise SystemExit(f"pgrouter apply (nothing to apply) exited {again.returncode}")
        print("  " + "\n  ".join(ln for ln in err.splitlines() if " waited " in ln
                                 or "applier stopped" in ln), file=sys.stderr)
        return {"start": t0, "first": first, "a": t_a, "b": t_b, "fp": fingerprint(dsn),
                "cpu_a": cpu_a, "cpu_b": cpu_b - cpu_a, "server_a": s_a - s0,
                "server_b": s_b - s_a,
                "cpu": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024,
                "idle": idle}
    finally:
        os.unlink(cfg.name)
        sql(server, f"drop database {db}")
        sql(server, "select pg_replication_origin_drop(%s)", origin)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--txn-rows", type=int, default=1000)
    ap.add_argument("--updates", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--profile", help="cProfile output of the first pgrouter round")
    ap.add_argument("--group-rows", type=int, default=0, metavar="N",
                    help="also measure pgrouter apply with [target] group_rows = N "
                         "(1: a target transaction per source transaction)")
    ap.add_argument("--stack", metavar="DIR", type=pathlib.Path,
                    help="a running dev stack's folder, read only (default: bring up the one "
                         "in .devstack)")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    info = stack(args.stack)
    src_server, dst_server = info.extra_pg["pg2"], info.extra_pg["pg3"]
    tag = uuid.uuid4().hex[:6]
    src_db = f"bapply_s_{tag}"
    sql(src_server, f"create database {src_db}")
    src = with_db(src_server, src_db)
    prefix = f"bapply{tag}"
    tx_topic = f"{prefix}tx"
    slots = [f"bapply_{tag}_{i}" for i in range(args.rounds)]
    router_slot = f"bapply_{tag}_router"
    cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    try:
        sql(src, TABLE)
        sql(src, "create publication pub for table t")
        for s in slots + [router_slot]:
            sql(src, "select pg_create_logical_replication_slot(%s, 'pgoutput')", s)
        n_a = write_workload(src, args)
        route_once(cfg, src, router_slot, info.kafka_bootstrap, tx_topic, prefix)
        ends = transaction_ends(info.kafka_bootstrap, tx_topic)
        assert len(ends) == n_a + args.updates, len(ends)
        last_a, last_b = ends[n_a - 1]["source"], ends[-1]["source"]
        results = run_rounds(args, src, dst_server, info.kafka_bootstrap, tx_topic, prefix,
                             slots, tag, last_a, last_b)
        report(args, results)
    finally:
        os.unlink(cfg.name)
        for s in slots + [router_slot]:
            try:
                sql(src, "select pg_drop_replication_slot(%s)", s)
            except psycopg2.Error:
                pass
        sql(src_server, f"drop database {src_db}")
        delete_topics(info.kafka_bootstrap, [tx_topic, f"{prefix}.public.t"])


def write_workload(src: str, args) -> int:
    """The inserts (``--txn-rows``-row transactions) then the one-row updates, written to
    the source; returns the number of insert transactions."""
    n_a = args.rows // args.txn_rows
    t = time.monotonic()
    sql(src, f"""do $$ begin for i in 0..{n_a - 1} loop
        insert into t select g, g % 1000, 'row ' || g, g * 1.25, now(), g % 2 = 0
          from generate_series(i * {args.txn_rows} + 1, (i + 1) * {args.txn_rows}) g;
        commit; end loop; end $$""")
    sql(src, f"""do $$ begin for i in 1..{args.updates} loop
        update t set a = a + 1, b = b || '+' where id = 1 + (i * 7919) % {args.rows};
        commit; end loop; end $$""")
    print(f"workload written in {time.monotonic() - t:.1f}s", file=sys.stderr)
    return n_a


def route_once(cfg, src: str, router_slot: str, bootstrap: str, tx_topic: str,
               prefix: str) -> None:
    """``pgrouter run --until-caught-up`` (librdkafka, with the transaction topic), untimed:
    the topics every pgrouter round reads."""
    cfg.write(toml({"source": {"dsn": src, "slot": router_slot, "publications": ["pub"]},
                    "kafka": {"bootstrap_servers": bootstrap,
                              "client": "librdkafka", "transactions_topic": tx_topic},
                    "routes": [{"name": "r", "tables": ["public.t"],
                                "topic": f"{prefix}.{{schema}}.{{table}}"}]}))
    cfg.close()
    t = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "actors.cli", "run", "-c", cfg.name,
                           "--until-caught-up"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pgrouter run exited {done.returncode}:\n{done.stderr[-3000:]}")
    print(f"router wrote the topics in {time.monotonic() - t:.1f}s", file=sys.stderr)


def run_rounds(args, src: str, dst_server: str, bootstrap: str, tx_topic: str, prefix: str,
               slots: list[str], tag: str, last_a: dict, last_b: dict) -> dict[str, list[dict]]:
    """The rounds, each contender in alternating order, every target checked equal to the
    source: each contender's results, round by round."""
    expected = fingerprint(src)
    results: dict[str, list[dict]] = {"native": [], "pgrouter": []}
    grouped = f"pgrouter group_rows={args.group_rows}"
    if args.group_rows:
        results[grouped] = []
    for r in range(args.rounds):
        order = list(results) if r % 2 == 0 else list(reversed(results))
        for who in order:
            rtag = f"{tag}{r}{'g' if who == grouped else ''}"
            if who == "native":
                res = run_native(src, dst_server, slots[r], last_a["end_lsn"],
                                 last_b["end_lsn"], rtag)
            else:
                res = run_pgrouter(dst_server, bootstrap, tx_topic, prefix,
                                   last_a["commit_lsn"], last_b["commit_lsn"], rtag,
                                   args.profile if r == 0 and who == "pgrouter" else None,
                                   args.group_rows if who == grouped else 0)
            assert res["fp"] == expected, f"{who} round {r}: target differs from source"
            results[who].append(res)
            print(f"round {r} {who}: inserts {res['a'] - res['first']:.2f}s, "
                  f"updates {res['b'] - res['a']:.2f}s", file=sys.stderr)
    return results


def stack(folder: pathlib.Path | None):
    """The dev stack's addresses: ``folder``'s state as it is (another checkout's running
    stack), else this checkout's, brought up with the two extra nodes."""
    import msgspec

    from devstack import StackInfo, ensure_up

    if folder is None:
        return ensure_up(ROOT / ".devstack", extra_postgres=2)
    state = folder / "state.json"
    try:
        info = msgspec.json.decode(state.read_bytes(), type=StackInfo)
    except (OSError, msgspec.DecodeError) as exc:
        raise SystemExit(f"--stack {folder}: no readable dev-stack state ({exc})") from exc
    if not {"pg2", "pg3"} <= set(info.extra_pg):
        raise SystemExit(f"--stack {folder}: the stack has no pg2 and pg3 nodes "
                         "(python -m devstack up --extra-postgres 2)")
    return info


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    for f in AdminClient({"bootstrap.servers": bootstrap}).delete_topics(topics).values():
        try:
            f.result(30)
        except Exception:  # already gone
            pass


def report(args, results: dict) -> None:
    rows_a, txns_b = args.rows, args.updates
    best = {who: {"a": min(r["a"] - r["first"] for r in rs), "b": min(r["b"] - r["a"] for r in rs)}
            for who, rs in results.items()}
    for who in (w for w in results if w != "native"):
        print(f"\n{'phase':<34} {'native':>14} {who:>16} {'ratio':>7}")
        n, p = best["native"], best[who]
        print(f"{f'inserts ({rows_a} rows, {args.txn_rows}-row txns)':<34} "
              f"{rows_a / n['a']:>9,.0f} r/s {rows_a / p['a']:>11,.0f} r/s "
              f"{n['a'] / p['a']:>6.2f}x")
        print(f"{f'updates ({txns_b} one-row txns)':<34} "
              f"{txns_b / n['b']:>9,.0f} t/s {txns_b / p['b']:>11,.0f} t/s "
              f"{n['b'] / p['b']:>6.2f}x")
        # per round, interleaved: pgrouter's time / native's (the "× native's time")
        times = [(p_r["a"] - p_r["first"]) / (n_r["a"] - n_r["first"])
                 for p_r, n_r in zip(results[who], results["native"])]
        times_b = [(p_r["b"] - p_r["a"]) / (n_r["b"] - n_r["a"])
                   for p_r, n_r in zip(results[who], results["native"])]
        print(f"  time / native's time, per round: inserts "
              f"{', '.join(f'{t:.2f}' for t in times)} (median {median(times):.2f}); "
              f"updates {', '.join(f'{t:.2f}' for t in times_b)} "
              f"(median {median(times_b):.2f})")
    for who in (w for w in results if w != "native"):
        pr = results[who]
        cpu_a = min(r["cpu_a"] for r in pr) / rows_a * 1e6
        cpu_b = min(r["cpu_b"] for r in pr) / txns_b * 1e6
        print(f"\n{who} CPU (its process, user+sys, process start included in inserts): "
              f"{cpu_a:.1f} µs per inserted row, {cpu_b:.1f} µs per one-row transaction; "
              f"peak RSS {max(r['rss_mb'] for r in pr):.0f} MB")
    srv = {who: (median([r["server_a"] for r in rs]) / rows_a * 1e6,
                 median([r["server_b"] for r in rs]) / txns_b * 1e6)
           for who, rs in results.items()}
    n_a, n_b = srv["native"]
    print("\ntarget server CPU, median of the rounds (the apply worker / the applier's "
          "backend, after its first commit):")
    for who, (a, b) in srv.items():
        ratio = "" if who == "native" else f" ({a / n_a:.2f}x, {b / n_b:.2f}x native's)"
        print(f"  {who}: {a:.1f} µs per inserted row, {b:.1f} µs per one-row "
              f"transaction{ratio}")
    print("process start to first commit, median: " + ", ".join(
        f"{who} {median([r['first'] - r['start'] for r in rs]):.2f}s"
        for who, rs in results.items()))
    for who, rs in results.items():
        if who != "native":
            idle = [r["idle"] for r in rs]
            print(f"a start with nothing to apply (process start to exit), {who}: median "
                  f"{median(idle):.2f}s ({', '.join(f'{t:.2f}' for t in idle)})")

if __name__ == "__main__":
    main()
