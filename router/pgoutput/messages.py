"""pgoutput message types, one frozen struct per message of PostgreSQL's
"Logical Replication Message Formats" (protocol.sgml, section 55.9 in PG 15 / 53.9 in PG 16).

Rules this module keeps:

* Field names are the documentation's, in snake_case. LSNs are ``int`` (format them with
  ``router.postgres.lsn.format_lsn``); timestamps are ``int`` microseconds since 2000-01-01 00:00
  UTC, exactly as on the wire (``router.pgoutput.timestamps`` converts them).
* A tuple is a ``tuple`` with one entry per column: ``str`` for text (``'t'``), ``bytes`` for
  binary (``'b'``), ``None`` for NULL (``'n'``) and the ``UNCHANGED_TOAST`` singleton for an
  unchanged TOASTed value (``'u'``). ``UNCHANGED_TOAST`` is not ``None`` on purpose: "the
  value is NULL" and "the value was not sent" must never be confused downstream.
* Data messages (Relation, Type, Insert, Update, Delete, Truncate, Message) carry ``xid``: the
  (sub)transaction id sent inside a stream block (protocol v2+), ``None`` outside one.
* Structs are frozen and hold only immutable values, so they are hashable and safe to share
  between actors; ``gc=False`` because they can never form reference cycles.
"""

from __future__ import annotations

from typing import Final

import msgspec


class _UnchangedToast:
    """Type of the ``UNCHANGED_TOAST`` singleton (tuple kind ``'u'``)."""

    __slots__ = ()
    _instance: "_UnchangedToast | None" = None

    def __new__(cls) -> "_UnchangedToast":
        # A singleton so ``value is UNCHANGED_TOAST`` works even after copy/pickle.
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __bool__(self) -> bool:
        # Truthiness of "not sent" is meaningless; refuse it rather than guess.
        raise TypeError("UNCHANGED_TOAST has no truth value; compare with `is`")

    def __reduce__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = _UnchangedToast()

#: Replica identity setting of a relation (``pg_class.relreplident``).
REPLICA_IDENTITY_DEFAULT = "d"
REPLICA_IDENTITY_NOTHING = "n"
REPLICA_IDENTITY_FULL = "f"
REPLICA_IDENTITY_INDEX = "i"

#: RelationColumn.flags bit: the column is part of the replica identity key.
COLUMN_FLAG_KEY = 1
#: Truncate.options bits.
TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2

_opts = dict(frozen=True, gc=False)


class Begin(msgspec.Struct, **_opts):
    """``B``: start of a (non-streamed) transaction."""

    final_lsn: int
    commit_time: int
    xid: int


class Commit(msgspec.Struct, **_opts):
    """``C``: end of a transaction started by Begin."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


class Origin(msgspec.Struct, **_opts):
    """``O``: the transaction was replicated from origin ``name`` (sent after Begin)."""

    commit_lsn: int
    name: str


class RelationColumn(msgspec.Struct, **_opts):
    flags: int
    name: str
    type_oid: int
    type_modifier: int


class Relation(msgspec.Struct, **_opts):
    """``R``: the layout of a relation; applies to every later change of ``relation_id``."""

    relation_id: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[RelationColumn, ...]
    xid: int | None = None

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.flags & COLUMN_FLAG_KEY)


class Type(msgspec.Struct, **_opts):
    """``Y``: the name of a non-built-in type used by a later Relation."""

    type_oid: int
    namespace: str
    name: str
    xid: int | None = None


class Insert(msgspec.Struct, **_opts):
    relation_id: int
    new: tuple
    xid: int | None = None


class Update(msgspec.Struct, **_opts):
    """``key`` is the ``K`` part (old replica-identity key, sent only when it changed),
    ``old`` the ``O`` part (whole old row, REPLICA IDENTITY FULL); at most one is set."""

    relation_id: int
    key: tuple | None
    old: tuple | None
    new: tuple
    xid: int | None = None


class Delete(msgspec.Struct, **_opts):
    """Exactly one of ``key`` (``K``) and ``old`` (``O``, REPLICA IDENTITY FULL) is set."""

    relation_id: int
    key: tuple | None
    old: tuple | None
    xid: int | None = None


class Truncate(msgspec.Struct, **_opts):
    options: int
    relation_ids: tuple[int, ...]
    xid: int | None = None


class Message(msgspec.Struct, **_opts):
    """``M``: a logical decoding message (``pg_logical_emit_message``)."""

    transactional: bool
    message_lsn: int
    prefix: str
    content: bytes
    xid: int | None = None


class StreamStart(msgspec.Struct, **_opts):
    """``S`` (v2): the following data messages, up to Stream Stop, belong to ``xid``."""

    xid: int
    first_segment: bool


class StreamStop(msgspec.Struct, **_opts):
    """``E`` (v2): end of a stream block."""


class StreamCommit(msgspec.Struct, **_opts):
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


class StreamAbort(msgspec.Struct, **_opts):
    """``A`` (v2): discard ``subxid`` (or the whole of ``xid`` when they are equal).
    ``abort_lsn``/``abort_time`` are sent only with parallel streaming (v4)."""

    xid: int
    subxid: int
    abort_lsn: int | None = None
    abort_time: int | None = None


class BeginPrepare(msgspec.Struct, **_opts):
    """``b`` (v3): start of a transaction that will be prepared (two-phase commit)."""

    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


class _Prepared(msgspec.Struct, **_opts):
    """The fields of ``Prepare`` and ``StreamPrepare`` (the same message, ``P`` or ``p``)."""

    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


class Prepare(_Prepared, **_opts):
    """``P`` (v3)."""


class CommitPrepared(msgspec.Struct, **_opts):
    """``K`` (v3)."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int
    xid: int
    gid: str


class RollbackPrepared(msgspec.Struct, **_opts):
    """``r`` (v3)."""

    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_time: int
    rollback_time: int
    xid: int
    gid: str


class StreamPrepare(_Prepared, **_opts):
    """``p`` (v3): a streamed transaction was prepared."""


#: Everything ``Decoder.decode`` can return.
PgOutputMessage = (
    Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate | Message
    | StreamStart | StreamStop | StreamCommit | StreamAbort | BeginPrepare | Prepare
    | CommitPrepared | RollbackPrepared | StreamPrepare
)

#: Data messages: the ones that carry ``xid`` inside a stream block.
DATA_MESSAGES = (Relation, Type, Insert, Update, Delete, Truncate, Message)
