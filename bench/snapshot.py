"""Initial snapshot throughput: rows/s of pgrouter's snapshot of a big table into Kafka
against the Kafka producer's own ceiling — the same records (the table's rows encoded by the
snapshot's encoder) produced by the same client with the same settings, with no PostgreSQL
(``bench/sink.py``'s producing code, twice: the client's per-record ``produce``, and the
records packed as the snapshot's C path hands them to ``actors.kafka.native_producer``) —
and against ``COPY (SELECT …) TO STDOUT`` of the same rows to /dev/null (psql); the big
table read by ``--sessions`` sessions at once (its block ranges, ``[snapshot] parallel``)
against one session; then K tables read in parallel against K sequential COPYs. Every
figure of a round comes from the same run, side by side; with ``--repeat`` the rounds are
interleaved and the medians printed.

    python bench/snapshot.py [--rows 2000000] [--tables 4] [--sessions 2] [--repeat 3]
                             [--client librdkafka|kafka-python] [--dsn ...] [--kafka ...]
    python bench/snapshot.py --ceilings --rows 500000 --repeat 5   # the producer alone

The snapshot's time is the one its summary line reports (reading, routing, encoding and
Kafka's acknowledgements, from the first table started to the last record acknowledged);
slot creation and the short stream afterwards are left out. The ceiling's clock runs from
the first ``produce`` to the last delivery report (topic created and producer warmed up
before). CPU seconds: the router process (user + system, all threads) and the producing
process. The rest of the machine (``bench/machine.py``) over each ceiling's clock and each
router's whole run: the broker's and the PostgreSQL cluster's CPU seconds and the share of
the cores left idle, and what they use per second with nothing to do — where the
snapshot's extra time goes on a machine whose cores the broker, PostgreSQL and the router
share. The router's peak RSS during the one-table runs shows that memory does not grow
with the table.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import statistics

import psycopg2

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import machine  # noqa: E402  (bench/machine.py)
import snapshot_report  # noqa: E402  (bench/snapshot_report.py)
COLUMNS = "id, grp, amount, note, created"
SETTINGS = {"linger_ms": 5}  # the router's [kafka] settings here and the ceiling's
ROUTER_RSS: list[float] = []  # MB, of each router run
ROUTER_WALL: list[float] = []  # s, of each router run: process start to exit


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


def copy_ranges_seconds(dsn: str, table: str, sessions: int) -> float:
    """The table's rows by ``COPY … TO STDOUT`` of its block ranges (as the snapshot splits
    it for ``sessions`` sessions, ``router.snapshot.ranges``) in ``sessions`` psql
    processes at once, to /dev/null: what PostgreSQL alone gives when a table is read by
    several sessions."""
    from router.snapshot.ranges import block_ranges

    conn = psycopg2.connect(dsn)
    try:
        cur = conn.cursor()
        cur.execute("select pg_relation_size(%s::regclass) / current_setting('block_size')::int, "
                    "reltuples::int8 from pg_class where oid = %s::regclass", (table, table))
        blocks, rows = cur.fetchone()
    finally:
        conn.close()
    ranges = block_ranges(blocks, sessions, rows)
    scripts = [[] for _ in range(sessions)]
    for i, (first, end) in enumerate(ranges):
        cond = f"ctid >= '({first},0)'::tid" + ("" if end is None else
                                                 f" and ctid < '({end},0)'::tid")
        scripts[i % sessions].append(f"COPY (SELECT {COLUMNS} FROM ONLY {table} WHERE {cond})"
                                     " TO STDOUT")
    started = time.monotonic()
    with open("/dev/null", "wb") as null:
        procs = [subprocess.Popen([psql(), dsn, "-X", "-q"] + [a for c in script
                                                              for a in ("-c", c)],
                                  stdout=null) for script in scripts if script]
        if any(p.wait() != 0 for p in procs):
            raise SystemExit("psql failed")
    return time.monotonic() - started


def snapshot_seconds(dsn: str, kafka: str, client: str, slot: str, pub: str,
                     tables: list[str], parallel: int,
                     tree: pathlib.Path = ROOT) -> tuple[float, int, float]:
    """(seconds, rows, router CPU seconds) of one initial snapshot; the whole process's wall
    time (``pgrouter run --until-caught-up``, start to exit) is appended to ``ROUTER_WALL``."""
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
settings = {{ {", ".join(f"{k} = {v}" for k, v in SETTINGS.items())} }}
[snapshot]
parallel = {parallel}
[log]
level = "info"
progress_interval = 30
[[routes]]
name = "{slot}"
tables = {json.dumps(tables)}
""")
        err = pathlib.Path(tmp) / "router.log"
        with open(err, "wb") as fh:
            started = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-m", "actors.cli", "run", "-c", str(cfg),
                                     "--until-caught-up"], cwd=tree, stdout=subprocess.DEVNULL,
                                    stderr=fh)
            # this router's own CPU time (wait4) and peak RSS (VmHWM: the rusage's counts
            # the fork of this big process before the exec)
            hwm = 0
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    ROUTER_WALL.append(time.monotonic() - started)
                    break
                try:
                    status_text = pathlib.Path(f"/proc/{proc.pid}/status").read_text()
                    hwm = max(hwm, int(re.search(r"VmHWM:\s+(\d+)", status_text).group(1)))
                except (OSError, AttributeError):
                    pass
                time.sleep(0.01)
        proc.returncode = os.waitstatus_to_exitcode(status)
        stderr = err.read_text()
    if proc.returncode != 0:
        raise SystemExit(f"pgrouter failed ({proc.returncode}):\n{stderr[-3000:]}")
    m = re.search(r"initial snapshot: done tables=\d+ rows=(\d+) seconds=([\d.]+)", stderr)
    if not m:
        raise SystemExit(f"no snapshot summary in the log:\n{stderr[-3000:]}")
    ROUTER_RSS.append(hwm / 1024)
    return float(m.group(2)), int(m.group(1)), usage.ru_utime + usage.ru_stime


def table_records(dsn: str, table: str, route: str):
    """``make(topic, n)`` and ``make_packed(topic, n)`` for ``bench/sink.py``: the table's
    rows as the snapshot encodes them (its COPY text, ``SnapshotRows`` with the table's
    columns and key), to ``topic``; ``make`` gives them one by one (parsed by
    ``router.snapshot.core.copy_rows``: the client's per-record ``produce``), ``make_packed`` as
    the snapshot's C path hands them to the client (COPY text in the reader's batches of
    ``BATCH_ROWS`` lines, packed, produced by ``actors.kafka.native_producer``). Read from
    PostgreSQL once, before any clock runs."""
    from actors.snapshot.reader import BATCH_ROWS
    from router.formats.envelope import TxContext
    from router.pgoutput import Relation
    from router.pgoutput.messages import RelationColumn
    from router.routing.change_router import CHUNK_RECORDS, ChangeRouter, RouteSpec
    from router.snapshot.core import copy_rows
    from router.snapshot.rows import CopyText, PackedRecords, SnapshotRows

    conn = psycopg2.connect(dsn)
    try:
        cur = conn.cursor()
        cur.execute("select a.attname, a.atttypid::int, a.atttypmod, coalesce(i.indisprimary, "
                    "false) from pg_attribute a left join pg_index i on i.indrelid = a.attrelid"
                    " and i.indisprimary and a.attnum = any(i.indkey::int2[]) where a.attrelid "
                    "= %s::regclass and a.attnum > 0 and not a.attisdropped order by a.attnum",
                    (table,))
        cols = tuple(RelationColumn(1 if pk else 0, name, oid, mod)
                     for name, oid, mod, pk in cur.fetchall())
        buf = io.BytesIO()
        cur.copy_expert(f"COPY (SELECT {', '.join(c.name for c in cols)} FROM ONLY {table}) "
                        "TO STDOUT", buf)
    finally:
        conn.close()
    text = buf.getvalue()
    rows = copy_rows(text)
    rel = Relation(relation_id=1, namespace="public", name=table, replica_identity="d",
                   columns=cols)
    key = tuple(c.name for c in cols if c.flags)

    tx = TxContext(xid=0, commit_lsn=1 << 30, end_lsn=(1 << 30) + 1, commit_time=0)

    def encoder(topic: str, packed: bool = False) -> SnapshotRows:
        return SnapshotRows(ChangeRouter(
            [RouteSpec(route, tables=frozenset({("public", table)}), topic=topic)],
            db="postgres", primary_keys={("public", table): key}), packed=packed)

    def make(topic: str, n: int) -> list:
        rows_of = encoder(topic)
        out: list = []
        for i in range(0, len(rows), CHUNK_RECORDS):
            out += rows_of.chunk(rel, rows[i:i + CHUNK_RECORDS], tx, i).records
        return out

    def make_packed(topic: str, n: int) -> list:
        rows_of = encoder(topic, packed=True)
        lines = text.splitlines(keepends=True)
        out: list = []
        for i in range(0, len(lines), BATCH_ROWS):
            batch = lines[i:i + BATCH_ROWS]
            records = rows_of.chunk(rel, CopyText(b"".join(batch), len(batch)), tx, i).records
            assert type(records) is PackedRecords, "the table is not on the C path"
            out.append(records)
        return out

    return make, make_packed, len(rows)


def encode_scaling(dsn: str, table: str, threads: int, rounds: int = 3) -> dict:
    """The router's own per-row work alone (no PostgreSQL, no Kafka): the table's COPY text
    (read once) turned into one route's records, cut in ``threads`` pieces at line ends,
    encoded one piece after the other in one thread and all pieces at once by ``threads``
    threads — by the C path (``router.snapshot.rows.encode_text``: no GIL while it parses
    and encodes) and by the Python path (rows parsed, then recorded one by one under the
    GIL). Medians of ``rounds``: {path: (1 thread s, N threads s, CPU s)}."""
    import threading

    from router.formats.envelope import TxContext
    from router.pgoutput import Relation
    from router.pgoutput.messages import RelationColumn
    from router.routing.change_router import ChangeRouter, RouteSpec
    from router.snapshot.core import copy_rows
    from router.snapshot.rows import SnapshotRows, encode_text

    conn = psycopg2.connect(dsn)
    try:
        cur = conn.cursor()
        cur.execute("select a.attname, a.atttypid::int, a.attnum = 1 from pg_attribute a where "
                    "a.attrelid = %s::regclass and a.attnum > 0 and not a.attisdropped "
                    "order by a.attnum", (table,))
        cols = tuple(RelationColumn(1 if pk else 0, name, oid, -1) for name, oid, pk in cur)
        buf = io.BytesIO()
        cur.copy_expert(f"COPY (SELECT {COLUMNS} FROM ONLY {table}) TO STDOUT", buf)
    finally:
        conn.close()
    data = buf.getvalue()
    cuts = [0] + [data.index(b"\n", len(data) * i // threads) + 1 for i in range(1, threads)]
    pieces = [data[a:b] for a, b in zip(cuts, cuts[1:] + [len(data)])]
    rel = Relation(relation_id=1, namespace="public", name=table, replica_identity="d",
                   columns=cols)
    rows = SnapshotRows(ChangeRouter([RouteSpec("r", tables=frozenset({("public", table)}))],
                                     db="postgres", primary_keys={("public", table): ("id",)}))
    tx = TxContext(xid=0, commit_lsn=1 << 30, end_lsn=(1 << 30) + 1, commit_time=0)
    parts = rows.text_parts(rel, tx)
    # the readers' batches: about 2000 lines each
    split = []
    for piece in pieces:
        lines = piece.splitlines(keepends=True)
        split.append([b"".join(lines[i:i + 2000]) for i in range(0, len(lines), 2000)])
    pieces = split

    def c_path(batches):
        for text in batches:
            encode_text(parts, text, tx.end_lsn, 0)

    def py_path(batches):
        for text in batches:
            rows.chunk(rel, copy_rows(text), tx, 0)

    out = {}
    for name, work in (("C", c_path), ("Python", py_path)):
        one, many, cpu = [], [], []
        for _ in range(rounds):
            t, c = time.monotonic(), time.process_time()
            for piece in pieces:
                work(piece)
            one.append(time.monotonic() - t)
            cpu.append(time.process_time() - c)
            workers = [threading.Thread(target=work, args=(p,)) for p in pieces]
            t = time.monotonic()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            many.append(time.monotonic() - t)
        out[name] = (statistics.median(one), statistics.median(many), statistics.median(cpu))
    return out


def kafka_alone_seconds(kafka: str, records: list) -> tuple[float, float]:
    """Kafka alone as issue 55 defines it: ``records`` (the snapshot's own, in memory,
    ``(topic, key, value, headers)``) produced by a plain confluent-kafka producer (acks=all, idempotent, librdkafka's
    defaults but ``SETTINGS``' linger) to a fresh one-partition topic, from the first
    ``produce`` to the last delivery report (producer connected and its id obtained
    before). (seconds, CPU seconds of this process)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"bench.alone.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": kafka, "acks": "all", "enable.idempotence": True,
                         "linger.ms": SETTINGS["linger_ms"]})
    try:
        producer.produce(topic, b"{}", b"null")
        producer.flush(30)
        acked, failed = [0], []

        def done(err, _msg):
            if err is not None:
                failed.append(err)
            acked[0] += 1
        start, cpu = time.perf_counter(), time.process_time()
        for _topic, key, value, headers in records:
            while True:
                try:
                    producer.produce(topic, value, key, headers=headers, on_delivery=done)
                    break
                except BufferError:  # the local queue is full: let it drain
                    producer.poll(0.005)
            producer.poll(0)
        if producer.flush(300) or failed or acked[0] != len(records):
            raise SystemExit(f"Kafka alone: {acked[0]} of {len(records)} delivered, {failed[:1]}")
        return time.perf_counter() - start, time.process_time() - cpu
    finally:  # waited for: a deletion queued when the client goes is never sent
        admin.delete_topics([topic])[topic].result(30)


def ceiling_seconds(client: str, kafka: str, make, n: int,
                    meter: "machine.Meter") -> tuple[float, float, "machine.Usage"]:
    """(seconds, CPU seconds, the rest of the machine over those seconds) of
    ``bench/sink.py``'s producing of ``make``'s records."""
    import sink  # bench/sink.py

    reads = []
    secs, cpu = sink.run_one(client, kafka, n, 1, make=make, settings=SETTINGS,
                             clock=lambda running: reads.append(meter.read()))
    return secs, cpu, reads[1] - reads[0]


def ceilings_only(args, ceilings: dict, n: int) -> None:
    """``--ceilings``: the producer alone, the table's records one by one (the client's
    ``produce``) and packed (``actors.kafka._producer``, the C-driven producer): what that C
    file buys, in alternating rounds; medians of ``--repeat``."""
    meter = machine.Meter(args.dsn)
    runs: dict[str, list] = {name: [] for name in ceilings}
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    for r in range(args.repeat):
        for name, made in ceilings.items():
            secs, cpu, _used = ceiling_seconds(args.client, args.kafka, made, n, meter)
            runs[name].append((secs, cpu))
        print(f"  round {r + 1}: " + ", ".join(f"{name} {v[-1][0]:.2f} s ({v[-1][1]:.2f} CPU s)"
                                           for name, v in runs.items()), flush=True)
    print(f"producer alone, {n} records ({args.client}), medians of {args.repeat} round(s):")
    for name, v in runs.items():
        secs = statistics.median(x[0] for x in v)
        cpu = statistics.median(x[1] for x in v)
        print(f"  {name:8} {secs:8.2f} s  {n / secs:12,.0f} records/s  cpu {cpu:6.2f} s")


def one_table(args, cur, tag: str, big: str, slots: list) -> None:
    """``--one``: issue 55's figures of one table, in alternating rounds: the whole
    ``pgrouter run --until-caught-up`` (process start to exit, initial snapshot of ``big``),
    Kafka alone (``kafka_alone_seconds``: the same records from memory, a plain client), the
    fixed cost of a start (the same run on an empty table: process, slot, snapshot, exit)
    and COPY to /dev/null; CPU seconds of each process. The router reads with ``--sessions``
    sessions (``[snapshot] parallel``, 4 by default in the config)."""
    empty = f"{tag}_empty"
    cur.execute(f"create table {empty} (id bigint primary key, grp int, amount numeric(12,2),"
                f" note text, created timestamptz)")
    cur.execute(f"create publication {empty} for table {empty}")
    make, _packed, n_records = table_records(args.dsn, big, f"{tag}_x")
    records = make(f"{tag}_x", n_records)
    size = statistics.mean(len(r[1]) + len(r[2]) + sum(len(k) + len(v) for k, v in r[3] or ())
                           for r in records[:1000])
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {n_records} "
          f"records of ~{size:.0f} bytes (key + value + headers)", flush=True)
    runs: dict[str, list] = {}
    # the router of this tree, and of --baseline's (a before/after in the same rounds)
    trees = [(ROOT, "")] + ([(pathlib.Path(args.baseline), " (baseline)")]
                            if args.baseline else [])

    def note(name: str, value: float) -> None:
        runs.setdefault(name, []).append(value)
    for r in range(args.repeat):
        secs, cpu = kafka_alone_seconds(args.kafka, records)
        note("alone", secs)
        note("alone cpu", cpu)
        for tree, name in trees:
            slots.append(f"{tag}_one{r}{'b' if name else ''}")
            snap, rows, cpu = snapshot_seconds(args.dsn, args.kafka, args.client, slots[-1],
                                               big, [big], args.sessions, tree)
            assert rows == args.rows, rows
            note(f"run{name}", ROUTER_WALL[-1])
            note(f"run{name} cpu", cpu)
            note(f"snap{name}", snap)
            slots.append(f"{tag}_empty{r}{'b' if name else ''}")
            _, rows, cpu = snapshot_seconds(args.dsn, args.kafka, args.client, slots[-1],
                                            empty, [empty], args.sessions, tree)
            note(f"start{name}", ROUTER_WALL[-1])
            note(f"start{name} cpu", cpu)
            note(f"run{name}/alone", runs[f"run{name}"][-1] / secs)
            note(f"(run{name}-start)/alone",
                 (runs[f"run{name}"][-1] - runs[f"start{name}"][-1]) / secs)
        note("copy", copy_seconds(args.dsn, big))
        print(f"  round {r + 1}: " + ", ".join(
            f"run{name} {runs[f'run{name}'][-1]:.2f} s (snapshot {runs[f'snap{name}'][-1]:.2f}"
            f" s), start{name} {runs[f'start{name}'][-1]:.2f} s" for _, name in trees)
            + f", Kafka alone {secs:.2f} s, COPY {runs['copy'][-1]:.2f} s; load "
            f"{os.getloadavg()[0]:.1f}", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"one table, {args.rows} rows ({args.client}), medians of {args.repeat} round(s):")
    print(f"  Kafka alone (plain confluent-kafka, acks=all, idempotent, from memory) "
          f"{med['alone']:6.2f} s  cpu {med['alone cpu']:5.2f} s")
    print(f"  COPY to /dev/null               {med['copy']:6.2f} s")
    for tree, name in trees:
        print(f"  {tree}:")
        print(f"    pgrouter run --until-caught-up  {med[f'run{name}']:6.2f} s  cpu "
              f"{med[f'run{name} cpu']:5.2f} s  (its snapshot line: {med[f'snap{name}']:.2f} s)")
        print(f"    start (empty table)             {med[f'start{name}']:6.2f} s  cpu "
              f"{med[f'start{name} cpu']:5.2f} s")
        print(f"    run / Kafka alone               {med[f'run{name}/alone']:6.2f}x  (median of "
              f"the rounds' ratios)")
        print(f"    (run - start) / Kafka alone     {med[f'(run{name}-start)/alone']:6.2f}x")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=2,
                    help="sessions reading the big table at once ([snapshot] parallel)")
    ap.add_argument("--repeat", type=int, default=1, help="interleaved rounds (medians)")
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--kafka", default="127.0.0.1:9092")
    ap.add_argument("--client", default="librdkafka", choices=["kafka-python", "librdkafka"])
    ap.add_argument("--one", action="store_true",
                    help="only one table against Kafka alone (a plain client) and an empty "
                         "table's start (issue 55)")
    ap.add_argument("--ceilings", action="store_true",
                    help="only the producer alone: the table's records one by one and packed "
                         "(what actors/kafka/_producer.c buys)")
    ap.add_argument("--baseline", metavar="DIR",
                    help="with --one: also the router of another checkout, in the same rounds")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    tag = f"bs_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(args.dsn)
    conn.autocommit = True
    cur = conn.cursor()
    big = f"{tag}_big"
    small = [] if args.one or args.ceilings else [f"{tag}_p{i}" for i in range(args.tables)]
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
        if args.one:
            return one_table(args, cur, tag, big, slots)
        make, make_packed, n_records = table_records(args.dsn, big, f"{tag}_one0_1")
        ceilings = {"ceiling": make}
        if args.client == "librdkafka":
            ceilings["packed"] = make_packed
        if args.ceilings:
            return ceilings_only(args, ceilings, n_records)
        all_tables(args, cur, tag, big, small, slots, ceilings, n_records)
    finally:
        for s in slots:
            cur.execute("select pg_drop_replication_slot(slot_name) from pg_replication_slots "
                        "where slot_name = %s", (s,))
        for t in [big, *small, f"{tag}_many", f"{tag}_empty"]:
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


def all_tables(args, cur, tag: str, big: str, small: list, slots: list, ceilings: dict,
               n_records: int) -> None:
    """The default run: the per-row work alone (``encode_scaling``), then in each round the
    producer's ceilings, the big table's snapshot by 1 and ``--sessions`` sessions, its COPYs,
    and the ``--tables`` small tables' snapshot against their sequential COPYs."""
    cur.execute(f"create publication {tag}_many for table {', '.join(small)}")
    meter = machine.Meter(args.dsn)
    before = meter.read()
    time.sleep(3)
    idle = meter.read() - before  # what the broker and PostgreSQL use with nothing to do
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    scaling = encode_scaling(args.dsn, big, args.sessions, args.repeat)
    print(f"the router's per-row work alone (COPY text to records, {args.rows} rows, "
          f"medians of {args.repeat}): 1 thread, then {args.sessions} threads at once")
    for path, (one, many, cpu) in scaling.items():
        print(f"  {path:6} path {one:6.2f} s ({cpu:5.2f} CPU s, {cpu / args.rows * 1e6:.2f} "
              f"µs/row)  {many:6.2f} s  ({one / many:.2f}x)", flush=True)
    runs: dict[str, list] = {}

    def note(name: str, value: float) -> None:
        runs.setdefault(name, []).append(value)

    for r in range(args.repeat):
        for name, made in ceilings.items():
            secs, cpu, used = ceiling_seconds(args.client, args.kafka, made, n_records, meter)
            note(name, secs)
            note(f"{name} cpu", cpu)
            note(f"{name} machine", used)
        for sessions in sorted({1, args.sessions}):
            slots.append(f"{tag}_one{r}_{sessions}")
            before = meter.read()
            secs, rows, cpu = snapshot_seconds(args.dsn, args.kafka, args.client,
                                               slots[-1], big, [big], sessions)
            note(f"snap{sessions} machine", meter.read() - before)
            assert rows == args.rows, rows
            note(f"snap{sessions}", secs)
            note(f"snap{sessions} cpu", cpu)
            note(f"snap{sessions}/ceiling", secs / runs["ceiling"][-1])
            if "packed" in ceilings:
                note(f"snap{sessions}/packed", secs / runs["packed"][-1])
        note("copy", copy_seconds(args.dsn, big))
        note("copy ranges", copy_ranges_seconds(args.dsn, big, args.sessions))
        note("speedup", runs["snap1"][-1] / runs[f"snap{args.sessions}"][-1])
        rss_mb = max(ROUTER_RSS)  # of the one-table runs
        note("copy many", sum(copy_seconds(args.dsn, s) for s in small))
        slots.append(f"{tag}_many{r}")
        secs, rows_many, cpu = snapshot_seconds(args.dsn, args.kafka, args.client,
                                                slots[-1], f"{tag}_many", small, args.tables)
        note("snap many", secs)
        note("snap many cpu", cpu)
        packed = (f", packed {runs['packed'][-1]:.2f} s" if "packed" in ceilings else "")
        print(f"  round {r + 1}: ceiling {runs['ceiling'][-1]:.2f} s{packed}, snapshot "
              f"1 session {runs['snap1'][-1]:.2f} s, {args.sessions} sessions "
              f"{runs[f'snap{args.sessions}'][-1]:.2f} s, COPY {runs['copy'][-1]:.2f} s",
              flush=True)
    snapshot_report.print_all_tables(args, runs, ceilings, idle, rss_mb, rows_many)


if __name__ == "__main__":
    main()
