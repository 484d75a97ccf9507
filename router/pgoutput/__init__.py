"""pgoutput, PostgreSQL's logical replication output plugin: message types and a sans-I/O
decoder (``Decoder(proto_version).decode(bytes) -> message``). See ``decode`` for the rules."""

from .decode import Decoder, MAX_PROTO_VERSION
from .messages import (
    COLUMN_FLAG_KEY, DATA_MESSAGES, REPLICA_IDENTITY_DEFAULT, REPLICA_IDENTITY_FULL,
    REPLICA_IDENTITY_INDEX, REPLICA_IDENTITY_NOTHING, TRUNCATE_CASCADE,
    TRUNCATE_RESTART_IDENTITY, UNCHANGED_TOAST, Begin, BeginPrepare, Commit, CommitPrepared,
    Delete, Insert, Message, Origin, PgOutputMessage, Prepare, Relation, RelationColumn,
    RollbackPrepared, StreamAbort, StreamCommit, StreamPrepare, StreamStart, StreamStop,
    Truncate, Type, Update,
)
from .timestamps import pg_time_to_datetime, pg_time_to_iso, pg_time_to_unix_ms

__all__ = [
    "Decoder", "MAX_PROTO_VERSION", "UNCHANGED_TOAST", "PgOutputMessage", "DATA_MESSAGES",
    "COLUMN_FLAG_KEY", "REPLICA_IDENTITY_DEFAULT", "REPLICA_IDENTITY_FULL",
    "REPLICA_IDENTITY_INDEX", "REPLICA_IDENTITY_NOTHING", "TRUNCATE_CASCADE",
    "TRUNCATE_RESTART_IDENTITY",
    "Begin", "Commit", "Origin", "Relation", "RelationColumn", "Type", "Insert", "Update",
    "Delete", "Truncate", "Message", "StreamStart", "StreamStop", "StreamCommit",
    "StreamAbort", "BeginPrepare", "Prepare", "CommitPrepared", "RollbackPrepared",
    "StreamPrepare",
    "pg_time_to_iso", "pg_time_to_unix_ms", "pg_time_to_datetime",
]
