"""Decoder throughput on one core: messages/s for a stream built from captured shapes.

    .venv/bin/python bench/decode.py [--changes 200000] [--repeat 3]

The stream is synthesised from the golden captures (tests/router/pgoutput/golden): the
captured Insert/Update/Delete messages of several tables (text format) are replayed in
transactions of 10 changes with Begin/Commit around them, until ``--changes`` changes.
Figures, side by side from one run (machines here are noisy, compare ratios):

* decode           – ``Decoder.decode`` only (the goal: >= 500k messages/s)
* decode+convert   – plus text→Python conversion of every tuple (``row_converter``)
* decode+assemble  – plus ``TransactionAssembler.feed_batch`` per batch of 2000 messages, as
  the decoder actor calls it (relation lookup, Change objects)
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from router.pgoutput import Begin, Commit, Decoder, Delete, Insert, Relation, Update  # noqa: E402
from router.pgoutput.render import parse_line  # noqa: E402
from router.stream.relations import RelationCache  # noqa: E402
from router.stream.transactions import TransactionAssembler  # noqa: E402
from router.formats.values import row_converter  # noqa: E402

GOLDEN = ROOT / "tests" / "router" / "pgoutput" / "golden"


def build_stream(changes: int) -> tuple[list[bytes], int]:
    decoder = Decoder(2)
    catalog: dict[int, bytes] = {}
    shapes, begin, commit = [], None, None
    for name in ("v1_text.tsv", "v2_stream.tsv"):
        for lineno, line in enumerate((GOLDEN / name).read_text().splitlines(), 1):
            _, data = parse_line(line, lineno)
            inside = decoder.in_stream
            msg = decoder.decode(data)
            if inside and type(msg) in (Relation, Insert, Update, Delete):
                data = data[:1] + data[5:]  # drop the streamed xid: the same message, plain
            kind = type(msg)
            if kind is Relation:
                catalog[msg.relation_id] = data
            elif kind in (Insert, Update, Delete) and len(data) < 2000 \
                    and msg.relation_id in catalog:
                shapes.append((data, catalog[msg.relation_id]))
            elif kind is Begin and begin is None:
                begin = data
            elif kind is Commit and commit is None:
                commit = data
    # keep the mix realistic: a few wide-row shapes, many narrow bulk inserts
    # (only shapes decoded under the relation's final layout, so conversion lines up)
    current = set(catalog.values())
    shapes = [data for data, rel in shapes if rel in current]
    wide = [s for s in shapes if s[5:6] != b"N" or s[6:8] != b"\x00\x02"]
    narrow = [s for s in shapes if s not in wide][:30]
    mix = wide[:20] + narrow
    stream = list(catalog.values())
    n = 0
    while n < changes:
        stream.append(begin)
        for i in range(10):
            stream.append(mix[(n + i) % len(mix)])
        stream.append(commit)
        n += 10
    return stream, n


def bench(label: str, fn, stream: list[bytes], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn(stream)
        best = min(best, time.perf_counter() - started)
    rate = len(stream) / best
    print(f"{label:<16} {len(stream):>9} messages  {best:7.3f} s  {rate / 1000:9.1f} k msg/s")
    return rate


def decode_only(stream):
    decode = Decoder(4).decode
    for data in stream:
        decode(data)


def decode_convert(stream):
    decode = Decoder(4).decode
    relations: dict[int, object] = {}
    for data in stream:
        msg = decode(data)
        kind = type(msg)
        if kind is Insert:
            relations[msg.relation_id](msg.new)
        elif kind is Update:
            relations[msg.relation_id](msg.new)
        elif kind is Delete:
            relations[msg.relation_id](msg.key if msg.key is not None else msg.old)
        elif kind is Relation:
            relations[msg.relation_id] = row_converter([c.type_oid for c in msg.columns])


def decode_assemble(stream):
    """What the decoder actor does: ``feed_batch`` per WAL batch of 2000 messages."""
    decode = Decoder(4).decode
    assembler = TransactionAssembler(RelationCache())
    feed_batch = getattr(assembler, "feed_batch", None)
    batch = list(enumerate(stream, 1))
    for i in range(0, len(batch), 2000):
        if feed_batch is not None:
            events = feed_batch(batch[i:i + 2000], decode)
        else:  # before feed_batch existed: message by message
            events = [e for lsn, data in batch[i:i + 2000]
                      for e in assembler.feed(lsn, decode(data))]
        for event in events:
            for _ in event.changes:
                pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    stream, changes = build_stream(args.changes)
    size = sum(map(len, stream))
    print(f"stream: {len(stream)} messages ({changes} changes, {size / 1e6:.1f} MB), "
          f"python {sys.version.split()[0]}, best of {args.repeat}")
    base = bench("decode", decode_only, stream, args.repeat)
    conv = bench("decode+convert", decode_convert, stream, args.repeat)
    asm = bench("decode+assemble", decode_assemble, stream, args.repeat)
    print(f"ratios: convert/decode {conv / base:.2f}, assemble/decode {asm / base:.2f}")


if __name__ == "__main__":
    main()
