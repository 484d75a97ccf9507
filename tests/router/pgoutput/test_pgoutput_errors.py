"""Malformed input: every truncated prefix, trailing bytes, unknown kinds, structural nonsense,
stream-block state, and hand-built v4 Stream Abort bytes."""

from __future__ import annotations

import struct

import pytest

from router.errors import (
    DecodeError, ProtocolViolation, TrailingBytes, TruncatedMessage, UnknownMessageType,
)
from router.pgoutput import Decoder, Insert, StreamAbort, StreamStart, StreamStop, Update

from conftest import CAPTURES


def distinct_messages(golden):
    """(name, proto_version, in_stream, bytes) for every distinct golden message."""
    seen, out = set(), []
    for name, version in CAPTURES.items():
        decoder = Decoder(version)
        for _, data in golden[name]:
            inside = decoder.in_stream
            key = (inside, data[:1], len(data))
            if key not in seen:  # bulk inserts repeat one shape thousands of times
                seen.add(key)
                out.append((name, version, inside, data))
            decoder.decode(data)
    return out


def decoder_for(version, in_stream):
    decoder = Decoder(version)
    if in_stream:
        decoder.decode(b"S" + struct.pack("!IB", 1, 1))
    return decoder


def all_messages(golden):
    """(name, proto_version, in_stream, bytes) for every golden message."""
    for name, version in CAPTURES.items():
        decoder = Decoder(version)
        for _, data in golden[name]:
            yield name, version, decoder.in_stream, data
            decoder.decode(data)


def test_every_truncated_prefix_of_every_message_raises_truncated(golden):
    decoders = {(v, inside): decoder_for(v, inside) for v in (1, 2, 3) for inside in (0, 1)
                if v > 1 or not inside}
    checked = 0
    for name, version, inside, data in all_messages(golden):
        decoder = decoders[version, inside]
        for cut in range(len(data)):
            try:
                decoder.decode(data[:cut])
            except TruncatedMessage as exc:
                assert 0 <= exc.offset <= cut, (name, data[:1], cut)
            else:
                pytest.fail(f"{name}: {len(data)}-byte {data[:1]!r} cut at {cut} decoded")
            checked += 1
        assert decoder.in_stream == bool(inside)  # a failed decode changes no state
    assert checked > 500_000


def test_trailing_byte_raises_trailing(golden):
    for name, version, inside, data in distinct_messages(golden):
        with pytest.raises(TrailingBytes) as info:
            decoder_for(version, inside).decode(data + b"\x00")
        assert info.value.offset == len(data), (name, data[:1])


def test_offsets_point_at_the_missing_field():
    data = b"I" + struct.pack("!I", 7) + b"N" + struct.pack("!h", 2) + b"t" + struct.pack(
        "!i", 10) + b"abc"
    with pytest.raises(TruncatedMessage) as info:
        Decoder().decode(data)
    assert info.value.offset == 13  # where the 10-byte value starts
    assert "byte offset 13" in str(info.value)


def insert(*columns: bytes) -> bytes:
    return b"I" + struct.pack("!IBh", 7, ord("N"), len(columns)) + b"".join(columns)


@pytest.mark.parametrize("data, offset", [
    (insert(b"x"), 8),                                            # unknown tuple kind
    (insert(b"t" + struct.pack("!i", -1)), 9),                    # negative length
    (insert(b"t" + struct.pack("!i", 2) + b"\xff\xfe"), 13),     # text not UTF-8
    (b"I" + struct.pack("!IBh", 7, ord("K"), 0), 5),              # Insert needs 'N'
    (b"D" + struct.pack("!IBh", 7, ord("N"), 0), 5),              # Delete needs K or O
    (b"U" + struct.pack("!IBh", 7, ord("K"), 0) + b"K" + struct.pack("!h", 0), 8),
    (b"I" + struct.pack("!IB", 7, ord("N")) + struct.pack("!h", -3), 6),  # negative count
    (b"T" + struct.pack("!iB", -1, 0), 1),                        # negative relation count
    (b"R" + struct.pack("!I", 1) + b"s\x00t\x00x" + struct.pack("!h", 0), 9),  # identity 'x'
    (b"R" + struct.pack("!I", 1) + b"s\x00t\x00d" + struct.pack("!h", -1), 10),
    (b"M" + struct.pack("!BQ", 1, 5) + b"p\x00" + struct.pack("!i", -5), 12),
    (b"O" + struct.pack("!Q", 1) + b"\xc3\x28\x00", 9),           # name not UTF-8
])
def test_structural_nonsense_is_a_decode_error(data, offset):
    with pytest.raises(DecodeError) as info:
        Decoder(4).decode(data)
    assert type(info.value) is DecodeError
    assert info.value.offset == offset


@pytest.mark.parametrize("version, kind", [
    (1, b"S"), (1, b"c"), (1, b"A"), (2, b"b"), (2, b"P"), (2, b"K"), (2, b"r"), (2, b"p"),
    (4, b"Z"), (4, b"\x00"),
])
def test_unknown_message_type(version, kind):
    with pytest.raises(UnknownMessageType):
        Decoder(version).decode(kind + b"\x00" * 40)


def test_empty_message_is_truncated():
    with pytest.raises(TruncatedMessage):
        Decoder().decode(b"")
    with pytest.raises(TruncatedMessage):
        decoder_for(2, True).decode(b"")


def test_unsupported_proto_version():
    with pytest.raises(ValueError):
        Decoder(5)


START = b"S" + struct.pack("!IB", 700, 1)
STOP = b"E"
ROW = struct.pack("!IBh", 16384, ord("N"), 1) + b"t" + struct.pack("!i", 1) + b"1"


def test_stream_block_state_drives_the_xid():
    decoder = Decoder(2)
    assert decoder.decode(b"I" + ROW) == Insert(16384, ("1",), None)
    assert decoder.decode(START) == StreamStart(700, True) and decoder.in_stream
    assert decoder.decode(b"I" + struct.pack("!I", 701) + ROW) == Insert(16384, ("1",), 701)
    assert decoder.decode(STOP) == StreamStop() and not decoder.in_stream
    assert decoder.decode(b"I" + ROW).xid is None


def test_update_with_key_part_inside_a_stream():
    decoder = decoder_for(2, True)
    tup = struct.pack("!h", 1) + b"n"
    msg = decoder.decode(b"U" + struct.pack("!I", 9) + struct.pack("!I", 5) + b"K" + tup
                         + b"N" + tup)
    assert msg == Update(5, (None,), None, (None,), 9)


@pytest.mark.parametrize("data", [
    START, b"B" + b"\x00" * 20, b"c" + b"\x00" * 29, b"A" + b"\x00" * 8,
    b"P" + b"\x00" * 29 + b"g\x00",
])
def test_control_messages_inside_a_stream_block_are_violations(data):
    decoder = decoder_for(3, True)
    with pytest.raises(ProtocolViolation):
        decoder.decode(data)
    assert decoder.in_stream


def test_stream_stop_outside_a_block_is_a_violation():
    with pytest.raises(ProtocolViolation):
        Decoder(2).decode(STOP)


def test_v4_stream_abort_with_and_without_abort_info():
    base = b"A" + struct.pack("!II", 700, 701)
    info = struct.pack("!Qq", 0x1_0000_0010, 789_000_000_123_456)
    v4 = Decoder(4)
    assert v4.decode(base + info) == StreamAbort(700, 701, 0x1_0000_0010, 789_000_000_123_456)
    assert v4.decode(base) == StreamAbort(700, 701)
    for cut in range(1, 16):
        with pytest.raises(TruncatedMessage):
            v4.decode(base + info[:cut])
    with pytest.raises(TrailingBytes):
        v4.decode(base + info + b"\x00")
    with pytest.raises(TrailingBytes):  # v2/v3 never send abort info
        Decoder(3).decode(base + info)


def test_non_bytes_input_is_accepted():
    data = b"I" + ROW
    assert Decoder().decode(bytearray(data)) == Decoder().decode(memoryview(data))
