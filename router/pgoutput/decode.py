"""Decoding of single pgoutput messages (sans-I/O): bytes in, one message struct out.

Rules:

* One decode function per message kind, chosen by the type byte from a dict built once per
  protocol version. Messages a version cannot send are ``UnknownMessageType``.
* The only state is whether we are inside a stream block (Stream Start … Stream Stop, v2+):
  there, data messages (Relation, Type, Insert, Update, Delete, Truncate, Message) begin with
  the Int32 xid of the (sub)transaction. Messages that cannot appear inside a block
  (Begin, Commit, Stream Commit/Abort/Prepare, the two-phase messages, a nested Stream Start)
  and a Stream Stop outside one are ``ProtocolViolation``. A message that fails to decode
  leaves the state unchanged.
* Stream Abort's abort LSN and time exist only with parallel streaming (v4); they are read
  when the protocol version is >= 4 and exactly 16 bytes remain.
* Namespace ``""`` on the wire means ``pg_catalog`` and is decoded as such (like proto.c).
* Every decode function ends by checking that no bytes are left over (``TrailingBytes``).
  Flag bytes are kept as sent: unknown flags are the consumer's business, not a decode error.
"""

from __future__ import annotations

import struct

from ..errors import DecodeError, ProtocolViolation, TruncatedMessage, UnknownMessageType
from ..native import NATIVE
from .messages import (
    Begin, BeginPrepare, Commit, CommitPrepared, Delete, Insert, Message, Origin, Prepare,
    Relation, RelationColumn, RollbackPrepared, StreamAbort, StreamCommit, StreamPrepare,
    StreamStart, StreamStop, Truncate, Type, Update,
)
from .reader import I16, I32, MAX_COLUMNS, U32, expect_end, read_cstring, read_tuple, truncated

_BEGIN = struct.Struct("!QqI")
_COMMIT = struct.Struct("!BQQq")
_RELID_ACTION = struct.Struct("!IB")
_TRUNCATE = struct.Struct("!iB")
_MESSAGE = struct.Struct("!BQ")
_STREAM_START = struct.Struct("!IB")
_STREAM_COMMIT = struct.Struct("!IBQQq")
_STREAM_ABORT = struct.Struct("!II")
_ABORT_INFO = struct.Struct("!Qq")
_BEGIN_PREPARE = struct.Struct("!QQqI")
_PREPARE = struct.Struct("!BQQqI")
_ROLLBACK_PREPARED = struct.Struct("!BQQqqI")
_COLUMN_TAIL = struct.Struct("!Ii")
_U64 = struct.Struct("!Q")

_N, _K, _O = ord("N"), ord("K"), ord("O")
_REPLICA_IDENTITIES = frozenset("dnfi")


def _fixed(st: struct.Struct, data: bytes, pos: int, what: str) -> tuple:
    if pos + st.size > len(data):
        raise truncated(what, pos, data)
    return st.unpack_from(data, pos)


def _namespace(data: bytes, pos: int) -> tuple[str, int]:
    ns, pos = read_cstring(data, pos, "namespace")
    return ns or "pg_catalog", pos


# --- transaction control -------------------------------------------------------------------


def decode_begin(data: bytes, pos: int, xid: None) -> Begin:
    if len(data) != pos + 20:
        _fixed(_BEGIN, data, pos, "Begin fields")
        expect_end(data, pos + 20, "Begin")
    return Begin(*_BEGIN.unpack_from(data, pos))


def decode_commit(data: bytes, pos: int, xid: None) -> Commit:
    if len(data) != pos + 25:
        _fixed(_COMMIT, data, pos, "Commit fields")
        expect_end(data, pos + 25, "Commit")
    return Commit(*_COMMIT.unpack_from(data, pos))


def decode_origin(data: bytes, pos: int, xid: None) -> Origin:
    (lsn,) = _fixed(_U64, data, pos, "Origin commit LSN")
    name, pos = read_cstring(data, pos + 8, "origin name")
    expect_end(data, pos, "Origin")
    return Origin(lsn, name)


# --- catalog -------------------------------------------------------------------------------


def decode_relation(data: bytes, pos: int, xid: int | None) -> Relation:
    (relid,) = _fixed(U32, data, pos, "relation id")
    namespace, pos = _namespace(data, pos + 4)
    name, pos = read_cstring(data, pos, "relation name")
    if pos + 3 > len(data):
        raise truncated("replica identity and column count", pos, data)
    identity = chr(data[pos])
    if identity not in _REPLICA_IDENTITIES:
        raise DecodeError(f"unknown replica identity {identity!r}", offset=pos)
    (ncols,) = I16.unpack_from(data, pos + 1)
    if not 0 <= ncols <= MAX_COLUMNS:
        raise DecodeError(f"invalid column count {ncols}", offset=pos + 1)
    pos += 3
    columns = []
    for _ in range(ncols):
        if pos >= len(data):
            raise truncated("column flags", pos, data)
        flags = data[pos]
        colname, pos = read_cstring(data, pos + 1, "column name")
        type_oid, typmod = _fixed(_COLUMN_TAIL, data, pos, "column type")
        pos += 8
        columns.append(RelationColumn(flags, colname, type_oid, typmod))
    expect_end(data, pos, "Relation")
    return Relation(relid, namespace, name, identity, tuple(columns), xid)


def decode_type(data: bytes, pos: int, xid: int | None) -> Type:
    (oid,) = _fixed(U32, data, pos, "type oid")
    namespace, pos = _namespace(data, pos + 4)
    name, pos = read_cstring(data, pos, "type name")
    expect_end(data, pos, "Type")
    return Type(oid, namespace, name, xid)


# --- row changes (the hot path) ------------------------------------------------------------


def decode_insert(data: bytes, pos: int, xid: int | None) -> Insert:
    if pos + 5 > len(data):
        raise truncated("relation id and 'N'", pos, data)
    relid, action = _RELID_ACTION.unpack_from(data, pos)
    if action != _N:
        raise DecodeError(f"Insert expects 'N', got {action:#04x}", offset=pos + 4)
    new, pos = read_tuple(data, pos + 5)
    if pos != len(data):
        expect_end(data, pos, "Insert")
    return Insert(relid, new, xid)


def decode_update(data: bytes, pos: int, xid: int | None) -> Update:
    if pos + 5 > len(data):
        raise truncated("relation id and tuple marker", pos, data)
    relid, action = _RELID_ACTION.unpack_from(data, pos)
    pos += 4
    key = old = None
    if action == _K or action == _O:
        before, pos = read_tuple(data, pos + 1)
        if action == _K:
            key = before
        else:
            old = before
        if pos >= len(data):
            raise truncated("'N'", pos, data)
        action = data[pos]
    if action != _N:
        raise DecodeError(f"Update expects 'N', got {action:#04x}", offset=pos)
    new, pos = read_tuple(data, pos + 1)
    if pos != len(data):
        expect_end(data, pos, "Update")
    return Update(relid, key, old, new, xid)


def decode_delete(data: bytes, pos: int, xid: int | None) -> Delete:
    if pos + 5 > len(data):
        raise truncated("relation id and tuple marker", pos, data)
    relid, action = _RELID_ACTION.unpack_from(data, pos)
    if action != _K and action != _O:
        raise DecodeError(f"Delete expects 'K' or 'O', got {action:#04x}", offset=pos + 4)
    before, pos = read_tuple(data, pos + 5)
    if pos != len(data):
        expect_end(data, pos, "Delete")
    if action == _K:
        return Delete(relid, before, None, xid)
    return Delete(relid, None, before, xid)


def decode_truncate(data: bytes, pos: int, xid: int | None) -> Truncate:
    count, options = _fixed(_TRUNCATE, data, pos, "Truncate relation count and options")
    if count < 0:
        raise DecodeError(f"negative relation count {count}", offset=pos)
    pos += 5
    end = pos + 4 * count
    if end > len(data):
        raise truncated(f"{count} relation ids", pos, data)
    expect_end(data, end, "Truncate")
    relids = struct.unpack_from(f"!{count}I", data, pos)
    return Truncate(options, relids, xid)


def decode_message(data: bytes, pos: int, xid: int | None) -> Message:
    flags, lsn = _fixed(_MESSAGE, data, pos, "Message flags and LSN")
    prefix, pos = read_cstring(data, pos + 9, "message prefix")
    (size,) = _fixed(I32, data, pos, "message length")
    if size < 0:
        raise DecodeError(f"negative message length {size}", offset=pos)
    pos += 4
    if pos + size > len(data):
        raise truncated("message content", pos, data)
    expect_end(data, pos + size, "Message")
    return Message(bool(flags & 1), lsn, prefix, data[pos:pos + size], xid)


# --- streaming (v2) ------------------------------------------------------------------------


def decode_stream_start(data: bytes, pos: int, xid: None) -> StreamStart:
    txid, first = _fixed(_STREAM_START, data, pos, "Stream Start fields")
    expect_end(data, pos + 5, "Stream Start")
    return StreamStart(txid, first == 1)


def decode_stream_stop(data: bytes, pos: int, xid: None) -> StreamStop:
    expect_end(data, pos, "Stream Stop")
    return StreamStop()


def decode_stream_commit(data: bytes, pos: int, xid: None) -> StreamCommit:
    fields = _fixed(_STREAM_COMMIT, data, pos, "Stream Commit fields")
    expect_end(data, pos + 29, "Stream Commit")
    return StreamCommit(*fields)


def _stream_abort(data: bytes, pos: int, with_info: bool) -> StreamAbort:
    txid, subxid = _fixed(_STREAM_ABORT, data, pos, "Stream Abort xids")
    pos += 8
    if with_info and len(data) > pos:
        abort_lsn, abort_time = _fixed(_ABORT_INFO, data, pos, "Stream Abort LSN and time")
        expect_end(data, pos + 16, "Stream Abort")
        return StreamAbort(txid, subxid, abort_lsn, abort_time)
    expect_end(data, pos, "Stream Abort")
    return StreamAbort(txid, subxid)


def decode_stream_abort(data: bytes, pos: int, xid: None) -> StreamAbort:
    return _stream_abort(data, pos, False)


def decode_stream_abort_v4(data: bytes, pos: int, xid: None) -> StreamAbort:
    return _stream_abort(data, pos, True)


# --- two-phase commit (v3) -----------------------------------------------------------------


def _with_gid(st: struct.Struct, data: bytes, pos: int, what: str) -> tuple:
    fields = _fixed(st, data, pos, f"{what} fields")
    gid, pos = read_cstring(data, pos + st.size, "gid")
    expect_end(data, pos, what)
    return (*fields, gid)


def decode_begin_prepare(data: bytes, pos: int, xid: None) -> BeginPrepare:
    return BeginPrepare(*_with_gid(_BEGIN_PREPARE, data, pos, "Begin Prepare"))


def decode_prepare(data: bytes, pos: int, xid: None) -> Prepare:
    return Prepare(*_with_gid(_PREPARE, data, pos, "Prepare"))


def decode_commit_prepared(data: bytes, pos: int, xid: None) -> CommitPrepared:
    return CommitPrepared(*_with_gid(_PREPARE, data, pos, "Commit Prepared"))


def decode_rollback_prepared(data: bytes, pos: int, xid: None) -> RollbackPrepared:
    return RollbackPrepared(*_with_gid(_ROLLBACK_PREPARED, data, pos, "Rollback Prepared"))


def decode_stream_prepare(data: bytes, pos: int, xid: None) -> StreamPrepare:
    return StreamPrepare(*_with_gid(_PREPARE, data, pos, "Stream Prepare"))


# --- dispatch ------------------------------------------------------------------------------

#: Data messages: carry an xid inside a stream block.
DATA_DECODERS = {
    b"R"[0]: decode_relation, b"Y"[0]: decode_type, b"I"[0]: decode_insert,
    b"U"[0]: decode_update, b"D"[0]: decode_delete, b"T"[0]: decode_truncate,
    b"M"[0]: decode_message,
}
#: Control messages by the protocol version that introduced them.
CONTROL_DECODERS = {
    1: {b"B"[0]: decode_begin, b"C"[0]: decode_commit, b"O"[0]: decode_origin},
    2: {b"S"[0]: decode_stream_start, b"E"[0]: decode_stream_stop,
        b"c"[0]: decode_stream_commit, b"A"[0]: decode_stream_abort},
    3: {b"b"[0]: decode_begin_prepare, b"P"[0]: decode_prepare,
        b"K"[0]: decode_commit_prepared, b"r"[0]: decode_rollback_prepared,
        b"p"[0]: decode_stream_prepare},
    4: {b"A"[0]: decode_stream_abort_v4},
}
_STREAM_START_BYTE, _STREAM_STOP_BYTE, _ORIGIN_BYTE = b"S"[0], b"E"[0], b"O"[0]

MAX_PROTO_VERSION = 4


class Decoder:
    """Decodes one pgoutput message at a time for a given ``proto_version`` (1–4).

    The stream-block state is the dispatch table in use: Stream Start switches to the table
    whose data decoders read the xid first, Stream Stop switches back, so the hot path is one
    dict lookup and one call whatever the state."""

    __slots__ = ("proto_version", "_table", "_plain", "_streamed")

    def __init__(self, proto_version: int = 1):
        if not 1 <= proto_version <= MAX_PROTO_VERSION:
            raise ValueError(f"unsupported pgoutput proto_version {proto_version}")
        self.proto_version = proto_version
        plain = dict(DATA_DECODERS)
        for version in range(1, proto_version + 1):
            plain.update(CONTROL_DECODERS[version])
        streamed = {kind: self._violation for kind in plain}
        streamed.update({kind: _with_xid(fn) for kind, fn in DATA_DECODERS.items()})
        streamed[_ORIGIN_BYTE] = decode_origin
        if _STREAM_START_BYTE in plain:
            plain[_STREAM_START_BYTE] = self._stream_start
            plain[_STREAM_STOP_BYTE] = self._violation
            streamed[_STREAM_STOP_BYTE] = self._stream_stop
        self._plain, self._streamed = plain, streamed
        self._table = plain

    @property
    def in_stream(self) -> bool:
        """True between a Stream Start and its Stream Stop."""
        return self._table is self._streamed

    def row_decoder(self):
        """``router._native.decode_row`` while outside a stream block (it decodes Insert,
        Update and Delete exactly as ``decode`` does there, and returns None for every other
        or malformed message), else None."""
        if NATIVE is None or self._table is self._streamed:
            return None
        return NATIVE.decode_row

    def decode(self, data: bytes):
        if type(data) is not bytes:
            data = bytes(data)
        try:
            fn = self._table[data[0]]
        except IndexError:
            raise TruncatedMessage("empty message", offset=0) from None
        except KeyError:
            raise UnknownMessageType(
                f"unknown message type {chr(data[0])!r} ({data[0]:#04x}) for proto_version "
                f"{self.proto_version}", offset=0) from None
        return fn(data, 1, None)

    def _stream_start(self, data: bytes, pos: int, xid: None) -> StreamStart:
        msg = decode_stream_start(data, pos, xid)
        self._table = self._streamed
        return msg

    def _stream_stop(self, data: bytes, pos: int, xid: None) -> StreamStop:
        msg = decode_stream_stop(data, pos, xid)
        self._table = self._plain
        return msg

    def _violation(self, data: bytes, pos: int, xid: None):
        where = "inside" if self.in_stream else "outside"
        raise ProtocolViolation(f"message {chr(data[0])!r} {where} a stream block", offset=0)


def _with_xid(fn):
    """Inside a stream block a data message starts with the Int32 (sub)transaction xid."""

    def decode_streamed(data: bytes, pos: int, xid: None):
        if len(data) < 5:
            raise truncated("streamed xid", 1, data)
        return fn(data, 5, _U32_UNPACK(data, 1)[0])

    decode_streamed.__name__ = f"{fn.__name__}_streamed"
    return decode_streamed


_U32_UNPACK = U32.unpack_from
