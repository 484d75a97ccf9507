"""``pgrouter decode [FILE|-]``: decode captured pgoutput messages to JSON lines.

Input lines are ``LSN<TAB>HEX`` as printed by
``psql -At -F $'\\t' -c "select lsn, encode(data,'hex') from pg_logical_slot_peek_binary_changes(
'slot', null, null, 'proto_version', '1', 'publication_names', 'pub', 'messages', 'true')"``
(add ``'binary','true'``; ``'streaming','true'`` with proto_version 2+; ``'two_phase','true'``
with 3+ and a slot created with two_phase). A malformed line stops the command with a one-line
error naming the line and byte offset (exit status 1).
"""

from __future__ import annotations

import argparse
import sys

import msgspec

from router.pgoutput import MAX_PROTO_VERSION
from router.pgoutput.render import decode_lines


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", default="-",
                        help="file of LSN<TAB>HEX lines ('-' or absent: stdin)")
    parser.add_argument("--proto-version", type=int, default=MAX_PROTO_VERSION,
                        choices=range(1, MAX_PROTO_VERSION + 1), metavar="N",
                        help=f"pgoutput protocol version (1-{MAX_PROTO_VERSION}, default "
                        f"{MAX_PROTO_VERSION}: accepts every message; whether data messages "
                        "carry an xid follows the stream blocks, not the version)")


def run(args: argparse.Namespace) -> int:
    encode = msgspec.json.Encoder().encode
    out = sys.stdout.buffer
    if args.file == "-":
        source = sys.stdin
        return _pump(source, args.proto_version, encode, out)
    with open(args.file, encoding="utf-8", errors="replace") as source:
        return _pump(source, args.proto_version, encode, out)


def _pump(source, proto_version: int, encode, out) -> int:
    try:
        for record in decode_lines(source, proto_version):
            out.write(encode(record))
            out.write(b"\n")
    finally:
        out.flush()
    return 0
