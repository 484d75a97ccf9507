"""Pure rendering for ``pgrouter decode``: ``LSN<TAB>HEX`` lines in, JSON-ready dicts out.

Rules:

* Input is what ``psql -At -F $'\\t'`` prints for ``select lsn, encode(data, 'hex') from
  pg_logical_slot_peek_binary_changes(...)``; blank lines are skipped.
* Output: ``lsn`` and ``type`` first, then the message's fields in snake_case. LSNs are
  ``X/Y`` strings, times ISO-8601 UTC with six fractional digits. Tuple values: text → string,
  NULL → null, unchanged TOAST → ``{"unchanged_toast": true}``, binary →
  ``{"binary": "<hex>"}``. ``xid`` of data messages appears only inside a stream block;
  Stream Abort's ``abort_lsn``/``abort_time`` only when sent.
* Errors are ``DecodeError`` naming the 1-based line number and the byte offset within the
  message (``offset`` is the message byte offset; the line is in the text).
"""

from __future__ import annotations

from ..errors import DecodeError
from ..postgres.lsn import format_lsn, parse_lsn
from . import messages as m
from .decode import Decoder
from .timestamps import pg_time_to_iso

TYPE_NAMES: dict[type, str] = {
    m.Begin: "begin", m.Commit: "commit", m.Origin: "origin", m.Relation: "relation",
    m.Type: "type", m.Insert: "insert", m.Update: "update", m.Delete: "delete",
    m.Truncate: "truncate", m.Message: "message", m.StreamStart: "stream_start",
    m.StreamStop: "stream_stop", m.StreamCommit: "stream_commit",
    m.StreamAbort: "stream_abort", m.BeginPrepare: "begin_prepare", m.Prepare: "prepare",
    m.CommitPrepared: "commit_prepared", m.RollbackPrepared: "rollback_prepared",
    m.StreamPrepare: "stream_prepare",
}

_LSN_FIELDS = frozenset({"final_lsn", "commit_lsn", "end_lsn", "message_lsn", "prepare_lsn",
                         "prepare_end_lsn", "rollback_end_lsn", "abort_lsn"})
_TIME_FIELDS = frozenset({"commit_time", "prepare_time", "rollback_time", "abort_time"})
_TUPLE_FIELDS = frozenset({"new", "key", "old"})
_OPTIONAL_FIELDS = frozenset({"abort_lsn", "abort_time"})
_UNCHANGED = {"unchanged_toast": True}


def render_value(value):
    if value is None or type(value) is str:
        return value
    if value is m.UNCHANGED_TOAST:
        return dict(_UNCHANGED)
    return {"binary": value.hex()}


def render_tuple(values: tuple | None) -> list | None:
    if values is None:
        return None
    return [render_value(v) for v in values]


def render_message(lsn: int, msg) -> dict:
    out: dict = {"lsn": format_lsn(lsn), "type": TYPE_NAMES[type(msg)]}
    for field in msg.__struct_fields__:
        value = getattr(msg, field)
        if field == "xid" and value is None and isinstance(msg, m.DATA_MESSAGES):
            continue
        if value is None and field in _OPTIONAL_FIELDS:
            continue
        if field in _LSN_FIELDS:
            value = format_lsn(value)
        elif field in _TIME_FIELDS:
            value = pg_time_to_iso(value)
        elif field in _TUPLE_FIELDS:
            value = render_tuple(value)
        elif field == "columns":
            value = [{"flags": c.flags, "name": c.name, "type_oid": c.type_oid,
                      "type_modifier": c.type_modifier} for c in value]
        elif field == "relation_ids":
            value = list(value)
        elif field == "content":
            field, value = "content_hex", value.hex()
        out[field] = value
    return out


def parse_line(line: str, lineno: int) -> tuple[int, bytes] | None:
    """``'0/16B3748\\t42...'`` -> ``(lsn, bytes)``; ``None`` for a blank line."""
    line = line.rstrip("\r\n")
    if not line.strip():
        return None
    lsn_text, sep, hex_text = line.partition("\t")
    if not sep:
        raise DecodeError(f"line {lineno}: expected LSN<TAB>HEX")
    try:
        lsn = parse_lsn(lsn_text)
    except ValueError:
        raise DecodeError(f"line {lineno}: not an LSN: {lsn_text[:40]!r}") from None
    hex_text = hex_text.strip()
    if hex_text.startswith("\\x"):  # bytea output without encode()
        hex_text = hex_text[2:]
    try:
        return lsn, bytes.fromhex(hex_text)
    except ValueError:
        raise DecodeError(f"line {lineno}: not hex data") from None


def decode_lines(lines, proto_version: int = 4):
    """Yield one rendered dict per message; raise ``DecodeError`` naming the line."""
    decoder = Decoder(proto_version)
    for lineno, line in enumerate(lines, 1):
        parsed = parse_line(line, lineno)
        if parsed is None:
            continue
        lsn, data = parsed
        try:
            msg = decoder.decode(data)
        except DecodeError as exc:
            error = type(exc)(f"line {lineno}: {exc.args[0] if exc.offset is None else _bare(exc)}",
                              offset=exc.offset)
            raise error from exc
        yield render_message(lsn, msg)


def _bare(exc: DecodeError) -> str:
    """The message without the " at byte offset N" suffix DecodeError adds itself."""
    text = str(exc)
    suffix = f" at byte offset {exc.offset}"
    return text[: -len(suffix)] if text.endswith(suffix) else text
