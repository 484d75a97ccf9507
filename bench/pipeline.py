"""The router's own CPU per change, without I/O: decode → assemble → route/encode in-process.

    .venv/bin/python bench/pipeline.py [--changes 200000] [--txn-rows 2000] [--repeat 3]
                                       [--compare] [--profile FILE]

The stream is what ``bench/e2e.py`` makes the walsender send (pgoutput v1, text format):
inserts of a 6-column table (bigint key, int, numeric, text, text, timestamptz) in
transactions of ``--txn-rows``, built here as bytes, in WAL batches of 2000 messages like the
slot reader's. Stages are timed cumulatively, best of ``--repeat`` (machines here are noisy;
``time.process_time`` is used, so other processes' load counts less):

* decode alone     – ``Decoder.decode`` of every message (what a consumer of single
  messages pays; the pipeline does not call it for row changes when the C hot path is built)
* decode+assemble  – ``TransactionAssembler.feed_batch``, what ``actors.pipeline.decoder`` does per
  batch (row changes decoded and assembled by ``router._native.feed_rows`` when built)
* +route/encode    – plus ``ChangeRouter.route`` (one route, records encoded for Kafka)
* +route, following – the same with the router following publication definitions at their
  WAL position (``router.routing.definitions``; no DDL in the stream): what that mechanism costs on
  the hot path, printed as a ratio

It prints µs per change for each and the implied changes per CPU-second of the main thread.
``--compare`` runs the same again with ``PGROUTER_PURE_PYTHON=1`` (the Python twins of the C
hot path) and prints the ratio.
``--profile FILE`` writes a cProfile of one full pass (with the profiler's overhead).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import struct
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from router import native  # noqa: E402
from router.pgoutput import Decoder  # noqa: E402
from router.stream.relations import RelationCache  # noqa: E402
from router.routing.change_router import ChangeRouter, RouteSpec  # noqa: E402
from router.stream.transactions import TransactionAssembler  # noqa: E402

RELID = 16390
BATCH = 2000
_COLUMNS = (("id", 20, -1, 1), ("account", 23, -1, 0), ("amount", 1700, 786438, 0),
            ("status", 25, -1, 0), ("note", 25, -1, 0), ("created_at", 1184, -1, 0))


def relation_message() -> bytes:
    out = [b"R", struct.pack("!I", RELID), b"public\x00bench_table\x00d",
           struct.pack("!h", len(_COLUMNS))]
    for name, oid, typmod, flags in _COLUMNS:
        out += [bytes([flags]), name.encode() + b"\x00", struct.pack("!Ii", oid, typmod)]
    return b"".join(out)


def insert_message(g: int) -> bytes:
    values = [str(g), str(g % 977), f"{g * 1.25:.2f}",
              "pending" if g % 3 == 0 else "settled",
              f"payment for order {g:08d} via card ending {g % 10000:04d}",
              f"2026-11-22 00:{(g // 60000) % 60:02d}:{(g // 1000) % 60:02d}.{g % 1000:03d}+00"]
    out = [b"I", struct.pack("!IBh", RELID, ord("N"), len(values))]
    for v in values:
        b = v.encode()
        out += [b"t", struct.pack("!i", len(b)), b]
    return b"".join(out)


def build_batches(changes: int, txn_rows: int) -> list[list[tuple[int, bytes]]]:
    messages = [relation_message()]
    lsn = 0x1000000
    xid = 1000
    for start in range(1, changes + 1, txn_rows):
        end = min(changes, start + txn_rows - 1)
        final = lsn + (end - start + 2) * 200
        messages.append(b"B" + struct.pack("!QqI", final, 800_000_000_000_000, xid))
        messages += [insert_message(g) for g in range(start, end + 1)]
        messages.append(b"C" + struct.pack("!BQQq", 0, final, final + 48, 800_000_000_000_000))
        xid += 1
    stream, lsn = [], 0x1000000
    for data in messages:
        lsn += 200
        stream.append((lsn, data))
    return [stream[i:i + BATCH] for i in range(0, len(stream), BATCH)]


def decode_only(batches) -> int:
    decode = Decoder(1).decode
    for batch in batches:
        for _lsn, payload in batch:
            decode(payload)
    return 0


def _assembled(batches):
    """What the decoder actor does: every released event of every batch."""
    decoder = Decoder(1)
    assembler = TransactionAssembler(RelationCache())
    feed_batch = getattr(assembler, "feed_batch", None)
    for batch in batches:
        if feed_batch is not None:
            events = feed_batch(batch, decoder.decode)
        else:
            events = []
            decode, feed = decoder.decode, assembler.feed
            for lsn, payload in batch:
                released = feed(lsn, decode(payload))
                if released:
                    events.extend(released)
        yield from events


def assemble(batches) -> int:
    n = 0
    for txn in _assembled(batches):
        n += txn.change_count
    return n


def route(batches, follow: bool = False) -> int:
    router = ChangeRouter([RouteSpec("bench", all_tables=True)], db="postgres")
    if follow:
        from router.routing.definitions import Definitions
        from router.routing.publications import Catalog

        router.follow(Definitions(Catalog({}, {}), lambda c: [RouteSpec("bench", all_tables=True)],
                                  slot="bench", topic="defs"))
    n = 0
    for txn in _assembled(batches):
        for chunk in router.route(txn):
            n += len(chunk.records)
    return n


def measure(label: str, fn, batches, changes: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        fn(batches)
        best = min(best, time.process_time() - started)
    per = best / changes * 1e6
    print(f"{label:<16} {best:7.3f} s  {per:6.2f} µs/change  {changes / best:10,.0f} changes/cpu-s",
          flush=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--txn-rows", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", metavar="FILE")
    parser.add_argument("--compare", action="store_true",
                        help="also run with PGROUTER_PURE_PYTHON=1 and print the ratio")
    args = parser.parse_args()
    batches = build_batches(args.changes, args.txn_rows)
    n = args.changes
    print(f"stream: {sum(map(len, batches))} messages in {len(batches)} batches, {n} inserts "
          f"in transactions of {args.txn_rows}; python {sys.version.split()[0]}, "
          f"best of {args.repeat} (process CPU time)")
    if args.profile:
        import cProfile

        cProfile.runctx("route(batches)", globals(), {"batches": batches}, args.profile)
        print(f"profile of one route pass written to {args.profile}")
        return
    assert assemble(batches) == n and route(batches) == n
    print(f"hot path: {native.describe()}", flush=True)
    measure("decode alone", decode_only, batches, n, args.repeat)
    a = measure("decode+assemble", assemble, batches, n, args.repeat)
    r = measure("+route/encode", route, batches, n, args.repeat)
    f = measure("+route, following", lambda b: route(b, follow=True), batches, n, args.repeat)
    print(f"following definitions / not: {f / r:.3f}x", flush=True)
    print(f"shares: decode+assemble {a / r:.0%}, route/encode {(r - a) / r:.0%}", flush=True)
    if args.compare and native.NATIVE is not None:
        # the same in a process with the C hot path turned off (router.native)
        cmd = [sys.executable, __file__, "--changes", str(n), "--txn-rows",
               str(args.txn_rows), "--repeat", str(args.repeat)]
        out = subprocess.run(cmd, env={**os.environ, "PGROUTER_PURE_PYTHON": "1"},
                             capture_output=True, text=True, check=True).stdout
        print(out.split("\n", 1)[1], end="")
        py = float(re.search(r"^\+route/encode\s+([\d.]+) s", out, re.M).group(1))
        print(f"python / native (decode → route/encode): {py / r:.2f}x")

if __name__ == "__main__":
    main()
