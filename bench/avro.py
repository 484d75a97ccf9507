"""The Avro conversion of the sink on one core: µs per record of ``AvroFormat.convert_all``,
Python (``_convert_all_py``) against the C lane (``router._native.AvroConverter``).

    .venv/bin/python bench/avro.py [--records 200000] [--batch 2000] [--repeat 5]

The records are the JSON envelopes pgrouter writes for ``bench/e2e.py``'s row (bigint key,
int, numeric(12,2), text, text, timestamptz), inserts in batches as the sink converts them
(one chunk at a time); ids are set by hand (no registry). Printed side by side from one run,
best of ``--repeat``: also msgspec's decoding of the values alone, what the Python path pays
before it converts anything.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import msgspec

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from router.formats.avro import AvroFormat, SchemasNeeded  # noqa: E402
from router.native import NATIVE  # noqa: E402
from router.formats.schema import ColumnSchema, TableSchema  # noqa: E402

TOPIC = "bench.public.payments"
SCHEMA = TableSchema("0123456789abcdef", "public", "payments", (
    ColumnSchema("id", "int8", 0, key=True), ColumnSchema("account", "int4", 0),
    ColumnSchema("amount", "numeric", 0, precision=12, scale=2),
    ColumnSchema("status", "text", 0), ColumnSchema("note", "text", 0),
    ColumnSchema("created_at", "timestamptz", 0)), ("id",), "d")


def records(n: int) -> list:
    source = {"db": "bench", "schema": "public", "table": "payments", "lsn": 0,
              "commit_lsn": 123456789, "seq": 0, "xid": 777,
              "commit_time": "2026-11-22T00:00:00.000001Z", "origin": None, "origin_lsn": None,
              "route": "bench", "schema_id": SCHEMA.schema_id}
    out = []
    for g in range(1, n + 1):
        row = {"id": g, "account": g % 977, "amount": f"{g * 1.25:.2f}",
               "status": "pending" if g % 3 == 0 else "settled",
               "note": f"payment for order {g:08d} via card ending {g % 10000:04d}",
               "created_at": f"2026-11-22 00:{g // 60000 % 60:02d}:{g // 1000 % 60:02d}"
                             f".{g % 1000:03d}+00"}
        value = {"op": "c", "before": None, "after": row,
                 "source": dict(source, lsn=1000 + g, seq=g), "ts_ms": 1795305600000}
        out.append((TOPIC, msgspec.json.encode({"id": g}), msgspec.json.encode(value),
                    [("pgrouter.commit_lsn", b"123456789")]))
    return out


def ready(fmt: AvroFormat, recs: list) -> None:
    fmt.learn(SCHEMA)
    try:
        fmt.convert_all(recs[:1])
    except SchemasNeeded as need:
        for i, subject in enumerate(need.subjects, 1):
            fmt.set_id(subject, i)
    fmt.convert_all(recs[:1])


def best(fn, batches: list, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for batch in batches:
            fn(batch)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    recs = records(args.records)
    batches = [recs[i:i + args.batch] for i in range(0, len(recs), args.batch)]
    fmt = AvroFormat()
    ready(fmt, recs)
    runs = {"msgspec decode only": lambda b: [msgspec.json.decode(r[2]) for r in b],
            "python": fmt._convert_all_py}
    if NATIVE is not None:
        assert fmt.convert_all(recs[:100]) == fmt._convert_all_py(recs[:100])
        runs["native"] = fmt.convert_all
    us = {name: best(fn, batches, args.repeat) / len(recs) * 1e6 for name, fn in runs.items()}
    print(f"{len(recs)} records in batches of {args.batch}, best of {args.repeat}")
    for name, t in us.items():
        print(f"  {name:<20} {t:6.2f} µs/record")
    if "native" in us:
        print(f"  python / native      {us['python'] / us['native']:6.1f}x")


if __name__ == "__main__":
    main()
