"""Kafka sink client throughput: records/s of each client alone, through the sink contract.

    .venv/bin/python bench/sink.py [--records 200000] [--partitions 1] [--clients ...]

Each client gets the same ~400-byte JSON records (pgrouter envelopes of a 6-column table,
JSON keys, the two position headers), handed over with ``produce(records, ticket,
on_done)`` in chunks of ``routing.CHUNK_RECORDS`` exactly as the sink does, acks=all,
idempotent. ``kafka-python-send`` is the same client forced through kafka-python's public
``send`` (its fallback path), to show what the direct accumulator path saves. The clock stops when the last delivery report arrived (every record durable).
The topics are created fresh per run and deleted afterwards. Figures come from one run, side
by side (machines here are noisy: compare the ratio).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import threading
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from router.routing.topics import TopicSpec  # noqa: E402
from router.routing.change_router import CHUNK_RECORDS  # noqa: E402
from router.snapshot.rows import PackedRecords  # noqa: E402

CLIENTS = ("kafka-python", "librdkafka")
#: kafka-python through its public ``send`` (the client's fallback), for comparison
SEND = "kafka-python-send"


def make_records(topic: str, n: int) -> list[tuple]:
    enc = msgspec.json.Encoder().encode
    out = []
    for i in range(n):
        after = {"id": i, "account": i % 977, "amount": f"{i * 1.25:.2f}",
                 "status": "settled" if i % 3 else "pending",
                 "note": "payment for order %08d via card ending %04d" % (i, i % 10000),
                 "created_at": "2026-11-22 00:%02d:%02d.123456+00" % (i // 60 % 60, i % 60)}
        value = {"op": "c", "before": None, "after": after,
                 "source": {"db": "postgres", "schema": "public", "table": "bench_orders",
                            "lsn": 0x1A2B3C4D + i * 120, "commit_lsn": 0x1A2B3C4D,
                            "seq": i, "xid": 123456, "commit_time": "2026-11-22T00:00:00.000000Z",
                            "origin": None, "origin_lsn": None, "route": "bench",
                            "schema_id": "0123456789abcdef"},
                 "ts_ms": 1795305600000}
        out.append((topic, enc({"id": i}), enc(value),
                    [("pgrouter.commit_lsn", b"439041101"), ("pgrouter.seq", str(i).encode())]))
    return out


def client_for(name: str, bootstrap: str, settings: dict | None = None):
    if name == "librdkafka":
        from actors.kafka.librdkafka import RdKafkaClient
        return RdKafkaClient(bootstrap, settings or {})
    from actors.kafka.kafka_python import KafkaPythonClient
    client = KafkaPythonClient(bootstrap, settings or {})
    if name == SEND:
        client._fast = False
    return client


def run_one(name: str, bootstrap: str, n: int, partitions: int,
            make=make_records, settings: dict | None = None,
            clock=None) -> tuple[float, float]:
    """Seconds (and CPU seconds of this process, all threads) from the first ``produce`` to
    the last delivery report of ``make(topic, n)`` (records as the sink hands them over) on
    a fresh topic; ``settings``: the client's (``[kafka] settings``). ``make`` may give
    chunks instead (a list of ``PackedRecords``, as the snapshot's C path hands them over):
    they are produced as they are. ``clock(running)``, if given, is called right when the
    clock starts (True) and stops (False)."""
    topic = f"bench.sink.{name}.{uuid.uuid4().hex[:8]}"
    client = client_for(name, bootstrap, settings)
    try:
        client.ensure_topics([TopicSpec(topic, partitions, 1)])
        # warm-up: metadata, connections, producer id
        client.produce_sync(topic, b"null", b"{}")
        records = make(topic, n)
        if records and type(records[0]) is PackedRecords:
            chunks, n = records, sum(len(c) for c in records)
        else:
            n = len(records)
            chunks = [records[i:i + CHUNK_RECORDS] for i in range(0, n, CHUNK_RECORDS)]
        done = threading.Event()
        state = {"acked": 0, "failed": None}
        lock = threading.Lock()

        def on_done(ticket, error, count):
            if error is not None:
                state["failed"] = error
                done.set()
                return
            with lock:
                state["acked"] += count
                if state["acked"] == n:
                    done.set()

        if clock is not None:
            clock(True)
        start, cpu = time.perf_counter(), time.process_time()
        for i, chunk in enumerate(chunks):
            client.produce(chunk, i, on_done)
        if not done.wait(300):
            raise SystemExit(f"{name}: only {state['acked']} of {n} acknowledged in 300 s")
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        if clock is not None:
            clock(False)
        if state["failed"] is not None:
            raise SystemExit(f"{name}: delivery failed: {state['failed']!r}")
        return elapsed, cpu
    finally:
        client.close(10.0)
        _delete_topic(bootstrap, topic)


def _delete_topic(bootstrap: str, topic: str) -> None:
    from kafka import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="pgrouter-bench")
    try:
        admin.delete_topics([topic])
    finally:
        admin.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--clients", default=",".join((SEND,) + CLIENTS),
                    help=f"comma-separated, of {SEND}, {', '.join(CLIENTS)}")
    ap.add_argument("--bootstrap", default=os.environ.get("PGROUTER_TEST_KAFKA", "127.0.0.1:9092"))
    args = ap.parse_args()
    size = len(make_records("t", 1)[0][2])
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{args.records} records of ~{size} bytes, {args.partitions} partition(s), "
          f"acks=all, idempotent, chunks of {CHUNK_RECORDS}")
    results = {}
    for name in args.clients.split(","):
        n = args.records
        elapsed, cpu = run_one(name, args.bootstrap, n, args.partitions)
        results[name] = n / elapsed
        print(f"  {name:<17} {elapsed:7.2f} s  {n / elapsed:10,.0f} records/s  cpu {cpu:6.2f} s"
              f" ({n / max(cpu, 1e-9):9,.0f}/cpu-s, all threads)", flush=True)
    base = results.get("kafka-python")
    for name, rate in results.items():
        if base and name != "kafka-python":
            print(f"  {name} / kafka-python = {rate / base:.2f}x")


if __name__ == "__main__":
    main()
