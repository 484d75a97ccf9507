"""The declared schema of the record envelope: what a value pgrouter writes to Kafka may hold,
as msgspec structs. Every encoder (``router.formats.envelope``'s Python and C paths, snapshot and
backfill rows, logical messages, ``router.formats.connect``) is tested against it
(``tests/router/test_record_schema.py``); ``docs/record-formats.md`` describes the same
fields for people.

Rules:

* ``validate(value)`` decodes strictly (no unknown field, every type checked) and then checks
  what one op implies: ``c``/``r`` carry ``after`` and no ``before``; ``d`` carries
  ``before`` and no ``after``; ``t`` carries ``truncate``; ``m`` carries ``message``;
  ``unchanged_toast`` names columns left out of ``after`` (Connect: given a placeholder). It raises ``RecordSchemaError``
  saying which rule a value breaks.
* A row is an object of column values: JSON numbers (integer types, OIDs, finite floats),
  booleans, null, or PostgreSQL's text form (everything else, ``"NaN"``/``"Infinity"``).
* The Kafka Connect form is ``{"schema", "payload"}`` with the same payload fields (row
  values then typed by the inline schema, ``op`` never ``u`` for a key change).
"""

from __future__ import annotations

from typing import Literal, Union

import msgspec

#: one column's value in pgrouter's JSON format
Value = Union[int, float, bool, str, None]
Row = dict[str, Value]


class RecordSchemaError(ValueError):
    """A value that does not follow the envelope's schema."""


class Source(msgspec.Struct, forbid_unknown_fields=True):
    db: str
    schema: Union[str, None]
    table: Union[str, None]
    lsn: int
    commit_lsn: Union[int, None]
    seq: int
    xid: Union[int, None]
    commit_time: Union[str, None]
    origin: Union[str, None]
    origin_lsn: Union[int, None]
    route: Union[str, None]
    schema_id: Union[str, None]


class Truncate(msgspec.Struct, forbid_unknown_fields=True):
    cascade: bool
    restart_identity: bool


class Message(msgspec.Struct, forbid_unknown_fields=True):
    prefix: str
    transactional: bool
    content: str  # base64


class Envelope(msgspec.Struct, forbid_unknown_fields=True):
    """A record's value in pgrouter's JSON format (``[kafka] format = "json"``)."""

    op: Literal["c", "u", "d", "r", "t", "m"]
    before: Union[Row, None]
    after: Union[Row, None]
    source: Source
    ts_ms: Union[int, None]
    unchanged_toast: Union[list[str], None] = None
    truncate: Union[Truncate, None] = None
    message: Union[Message, None] = None


class ConnectPayload(msgspec.Struct, forbid_unknown_fields=True):
    before: Union[dict, None]
    after: Union[dict, None]
    source: Source
    op: Literal["c", "u", "d", "r", "t", "m"]
    ts_ms: Union[int, None]
    unchanged_toast: Union[list[str], None]


class ConnectEnvelope(msgspec.Struct, forbid_unknown_fields=True):
    """A record's value in Kafka Connect's JSON (``[kafka] format = "connect"``)."""

    schema: dict
    payload: ConnectPayload


_envelope = msgspec.json.Decoder(Envelope)
_connect = msgspec.json.Decoder(ConnectEnvelope)


def validate(value: bytes) -> Envelope:
    """The envelope ``value`` holds, checked against the schema and the rules of its op."""
    try:
        env = _envelope.decode(value)
    except msgspec.ValidationError as exc:
        raise RecordSchemaError(str(exc)) from None
    _check_op(env.op, env.before, env.after, env.unchanged_toast)
    if env.unchanged_toast is not None and any(c in env.after for c in env.unchanged_toast):
        raise RecordSchemaError("`unchanged_toast` names columns left out of `after`")
    if (env.op == "t") != (env.truncate is not None):
        raise RecordSchemaError("`truncate` is present exactly on op t")
    if (env.op == "m") != (env.message is not None):
        raise RecordSchemaError("`message` is present exactly on op m")
    if env.op in "cudr" and env.source.schema_id is None:
        raise RecordSchemaError("a row change names its schema (`source.schema_id`)")
    return env


def validate_connect(value: bytes) -> ConnectEnvelope:
    """The Kafka Connect record ``value`` holds, checked like ``validate``."""
    try:
        env = _connect.decode(value)
    except msgspec.ValidationError as exc:
        raise RecordSchemaError(str(exc)) from None
    p = env.payload
    _check_op(p.op, p.before, p.after, p.unchanged_toast)
    names = [f.get("field") for f in env.schema.get("fields", ())]
    if names != ["before", "after", "source", "op", "ts_ms", "unchanged_toast"]:
        raise RecordSchemaError(f"the inline schema's fields are {names}")
    return env


def _check_op(op: str, before, after, toast) -> None:
    if op in ("c", "r") and (after is None or before is not None):
        raise RecordSchemaError(f"op {op} carries `after` and no `before`")
    if op == "u" and after is None:
        raise RecordSchemaError("op u carries `after`")
    if op == "d" and (before is None or after is not None):
        raise RecordSchemaError("op d carries `before` and no `after`")
    if op in ("t", "m") and (before is not None or after is not None):
        raise RecordSchemaError(f"op {op} carries no row")
    if toast is not None:
        if not toast:
            raise RecordSchemaError("`unchanged_toast` is absent rather than empty")
        if after is None:
            raise RecordSchemaError("`unchanged_toast` comes with `after`")
