"""``pgrouter decode [FILE|-]``: decode captured pgoutput messages to JSON lines;
``pgrouter decode -c CONFIG --topic T``: a topic's records as JSON lines, whatever format
the router wrote them in (Avro decoded with the schemas of ``[kafka.registry]``).

Input lines are ``LSN<TAB>HEX`` as printed by
``psql -At -F $'\\t' -c "select lsn, encode(data,'hex') from pg_logical_slot_peek_binary_changes(
'slot', null, null, 'proto_version', '1', 'publication_names', 'pub', 'messages', 'true')"``
(add ``'binary','true'``; ``'streaming','true'`` with proto_version 2+; ``'two_phase','true'``
with 3+ and a slot created with two_phase). A malformed line stops the command with a one-line
error naming the line and byte offset (exit status 1).

With ``--topic`` each record of the topic (from its first offset, or from the last ``--tail N``
offsets of each partition, up to the end offsets at start; read_committed) is one line ``{"partition", "offset",
"key", "value"}``: JSON keys and values as they are, Avro ones as pgrouter's JSON envelope
(``router.formats.avro_read``), anything else as a string.
"""

from __future__ import annotations

import argparse
import sys

import msgspec

from router.errors import ConfigError

from router.pgoutput import MAX_PROTO_VERSION
from router.pgoutput.render import decode_lines


def add_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", default="-",
                        help="file of LSN<TAB>HEX lines ('-' or absent: stdin)")
    parser.add_argument("--topic", help="print this Kafka topic's records instead (needs -c)")
    parser.add_argument("-c", "--config", help="router config: Kafka and the schema registry")
    parser.add_argument("--tail", type=int, metavar="N",
                        help="with --topic: only the last N offsets of each partition (the "
                        "commit markers of Kafka transactions take offsets too)")
    parser.add_argument("--proto-version", type=int, default=MAX_PROTO_VERSION,
                        choices=range(1, MAX_PROTO_VERSION + 1), metavar="N",
                        help=f"pgoutput protocol version (1-{MAX_PROTO_VERSION}, default "
                        f"{MAX_PROTO_VERSION}: accepts every message; whether data messages "
                        "carry an xid follows the stream blocks, not the version)")


def run(args: argparse.Namespace) -> int:
    if args.topic:
        return _topic(args)
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


def _topic(args: argparse.Namespace) -> int:
    from ..kafka.registry import decoder_for
    from ..kafka.survey import records
    from .config_file import load

    if not args.config:
        raise ConfigError("--topic needs -c CONFIG (where Kafka and the registry are)")
    cfg = load(args.config, "decode")
    decoder = decoder_for(cfg.kafka.registry)
    out = sys.stdout.buffer
    encode = msgspec.json.Encoder().encode
    try:
        for partition, offset, key, value in records(cfg.kafka.bootstrap_servers,
                                                     dict(cfg.kafka.settings), args.topic,
                                                     tail=args.tail):
            out.write(encode({"partition": partition, "offset": offset,
                              "key": _shown(key, decoder, key=True),
                              "value": _shown(value, decoder)}))
            out.write(b"\n")
    finally:
        out.flush()
    return 0


def _shown(data: bytes | None, decoder, *, key: bool = False):
    """A key or value as JSON: decoded JSON, an Avro record read back, else its text."""
    if data is None:
        return None
    if data[:1] == b"\x00":
        if decoder is None:
            raise ConfigError("the topic holds Avro records: the config needs its "
                              "[kafka.registry]", path="kafka.registry")
        return decoder.key(data) if key else decoder.envelope(data)
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return data.decode(errors="replace")
