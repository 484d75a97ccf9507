"""Bounds-checked reading of untrusted pgoutput bytes.

Rules:

* Every read checks the length first; running past the end raises ``TruncatedMessage`` with
  the byte offset of the field that could not be read. Fixed-size groups of fields are checked
  with a single comparison (one ``Struct.unpack_from`` per group), which keeps the hot path
  cheap without ever indexing unchecked bytes.
* Nothing but ``DecodeError`` subclasses leaves this module: ``struct.error``, ``IndexError``
  and ``UnicodeDecodeError`` cannot happen (lengths are checked) or are translated.
* Readers are plain functions taking ``(data, pos)`` and returning ``(value, new_pos)``;
  ``data`` is always ``bytes``, so slicing copies only the value itself.
"""

from __future__ import annotations

import struct

from ..errors import DecodeError, TrailingBytes, TruncatedMessage
from .messages import UNCHANGED_TOAST

U8 = struct.Struct("!B")
U32 = struct.Struct("!I")
I16 = struct.Struct("!h")
I32 = struct.Struct("!i")
U64 = struct.Struct("!Q")

#: Upper bound for a tuple's column count: PostgreSQL's MaxTupleAttributeNumber.
MAX_COLUMNS = 1664


def truncated(what: str, pos: int, data: bytes) -> TruncatedMessage:
    return TruncatedMessage(f"message ends before {what} ({len(data) - pos} bytes left)",
                            offset=pos)


def need(data: bytes, pos: int, size: int, what: str) -> None:
    if pos + size > len(data):
        raise truncated(what, pos, data)


def expect_end(data: bytes, pos: int, what: str) -> None:
    if pos != len(data):
        raise TrailingBytes(f"{len(data) - pos} bytes after the end of {what}", offset=pos)


def read_cstring(data: bytes, pos: int, what: str) -> tuple[str, int]:
    """A NUL-terminated string (PostgreSQL ``String``), decoded as UTF-8."""
    end = data.find(b"\x00", pos)
    if end < 0:
        raise TruncatedMessage(f"message ends inside {what} (no NUL terminator)", offset=pos)
    try:
        return data[pos:end].decode(), end + 1
    except UnicodeDecodeError as exc:
        raise DecodeError(f"{what} is not valid UTF-8", offset=pos + exc.start) from None


def read_tuple_py(data: bytes, pos: int) -> tuple[tuple, int]:
    """TupleData: Int16 column count, then per column a kind byte and maybe Int32 + bytes.

    The loop runs once per column of every row, so it checks bounds the cheap way: a kind
    byte or a length past the end raises ``IndexError``/``struct.error`` (try blocks cost
    nothing in 3.11 until they catch), translated below into ``TruncatedMessage`` at the
    field's offset; a value's end is compared with the message's end once. Lengths are read
    unsigned: a "negative" one always ends past the end and is reported as such there."""
    end = len(data)
    if pos + 2 > end:
        raise truncated("tuple column count", pos, data)
    natts = (data[pos] << 8) | data[pos + 1]
    if natts > MAX_COLUMNS:
        # PostgreSQL reads this as uint16; anything above the attribute limit (and so every
        # "negative" count) cannot come from a real server.
        raise DecodeError(f"tuple column count {natts} exceeds {MAX_COLUMNS}", offset=pos)
    pos += 2
    values = [None] * natts  # NULLs ('n') need no store
    unpack_len = _U32_UNPACK
    start = pos
    try:
        # Kind bytes are literals (116 't', 110 'n', 117 'u', 98 'b'): constants are cheaper
        # than global lookups in this loop.
        for i in range(natts):
            kind = data[pos]
            if kind == 116:
                start = pos + 5
                pos = start + unpack_len(data, pos + 1)[0]
                if pos > end:
                    _value_past_end(data, start)
                values[i] = data[start:pos].decode()
            elif kind == 110:
                pos += 1
            elif kind == 117:
                values[i] = UNCHANGED_TOAST
                pos += 1
            elif kind == 98:
                start = pos + 5
                pos = start + unpack_len(data, pos + 1)[0]
                if pos > end:
                    _value_past_end(data, start)
                values[i] = data[start:pos]
            else:
                raise DecodeError(f"unknown tuple column kind {kind:#04x}", offset=pos)
    except IndexError:
        raise truncated("tuple column kind", pos, data) from None
    except struct.error:
        raise truncated("tuple value length", pos + 1, data) from None
    except UnicodeDecodeError as exc:
        raise DecodeError("text value is not valid UTF-8", offset=start + exc.start) from None
    return tuple(values), pos


def _value_past_end(data: bytes, start: int):
    size = _U32_UNPACK(data, start - 4)[0]
    if size >= 0x80000000:
        raise DecodeError(f"negative tuple value length {size - 0x100000000}", offset=start - 4)
    raise truncated("tuple value", start, data)


_U32_UNPACK = U32.unpack_from


def _accelerated():
    # imported here: router.native needs MAX_COLUMNS and UNCHANGED_TOAST from this package
    from ..native import NATIVE
    if NATIVE is None:
        return read_tuple_py
    from .messages import Delete, Insert, Update
    NATIVE.configure(UNCHANGED_TOAST, MAX_COLUMNS, Insert, Update, Delete)
    fast = NATIVE.read_tuple

    def read_tuple(data: bytes, pos: int) -> tuple[tuple, int]:
        """``read_tuple_py`` in C; malformed input goes to ``read_tuple_py`` for its error."""
        return fast(data, pos) or read_tuple_py(data, pos)

    return read_tuple


#: TupleData reader used by the decoder: the C one when built, else ``read_tuple_py``
read_tuple = _accelerated()
