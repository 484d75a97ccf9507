"""One exception tree that says whose fault a failure is.

* ``ConfigError``   – the user's configuration is wrong (never retried).
* ``DecodeError``   – the server sent bytes we cannot accept (never retried: retrying reads
  the same bytes again).
* ``SourceError``   – talking to PostgreSQL failed.
* ``SinkError``     – talking to Kafka failed.
* ``GaveUp``, ``Aborted`` – the run ended by its retry budget or a second signal.
* ``InternalError`` – a bug in pgrouter.

Whether a failure is retried is decided in one place, ``RETRYABLE`` below, keyed by type,
never by message text.
"""

from __future__ import annotations

import contextlib


class PgRouterError(Exception):
    """Base of every error pgrouter raises on purpose."""


# --- configuration -------------------------------------------------------------------------


class ConfigError(PgRouterError):
    """The configuration is invalid. ``path`` names the offending key (``routes[1].topic``)."""

    def __init__(self, message: str, *, path: str | None = None, source: str | None = None):
        self.path = path
        self.source = source
        where = ""
        if source:
            where += f"{source}: "
        if path:
            where += f"{path}: "
        super().__init__(f"{where}{message}")


class FilterError(ConfigError):
    """A row filter is not valid. Carries the 1-based line and column of the construct."""

    def __init__(self, message: str, *, line: int = 1, column: int = 1, expression: str = "",
                 path: str | None = None):
        self.line = line
        self.column = column
        self.expression = expression
        super().__init__(f"{message} (line {line}, column {column})", path=path)


# --- bad input from the server -------------------------------------------------------------


class DecodeError(PgRouterError):
    """Bytes from the server that do not form a valid pgoutput message."""

    def __init__(self, message: str, *, offset: int | None = None):
        self.offset = offset
        if offset is not None:
            message = f"{message} at byte offset {offset}"
        super().__init__(message)


class TruncatedMessage(DecodeError):
    """The message ended before a field it must contain."""


class TrailingBytes(DecodeError):
    """The message has bytes left over after its last field."""


class UnknownMessageType(DecodeError):
    """The type byte names no message this protocol version can send."""


class ProtocolViolation(DecodeError):
    """Well-formed messages in an order the protocol does not allow (e.g. Insert outside a
    transaction, or a change for a relation never described)."""


# --- PostgreSQL ----------------------------------------------------------------------------


class SourceError(PgRouterError):
    """Talking to PostgreSQL failed."""


class SourceUnavailable(SourceError):
    """Connection refused, dropped or reset; the server restarting. Transient."""


class AuthenticationFailed(SourceError):
    """PostgreSQL refused the login: wrong password, unknown role, no pg_hba.conf entry
    (SQLSTATE class 28). Permanent until the DSN or the server's configuration changes."""


class DatabaseMissing(SourceError):
    """The database the DSN names does not exist (SQLSTATE 3D000)."""


class PrivilegeMissing(SourceError):
    """The role lacks a privilege pgrouter needs, e.g. REPLICATION (SQLSTATE 42501)."""


class SlotInUse(SourceError):
    """Another process streams from the slot. Permanent until that process stops."""


class SlotMissing(SourceError):
    """The slot does not exist and the config does not allow creating it."""


class SlotBehind(SourceError):
    """The server reached after a reconnection (a promoted standby) lacks WAL the router
    already confirmed: continuing would diverge from what Kafka holds."""


class PublicationMissing(SourceError):
    """A publication named in the config does not exist."""


class SlotInvalidated(SourceError):
    """The server invalidated the slot (``wal_status = lost``: it removed WAL the slot still
    needed, e.g. past ``max_slot_wal_keep_size``). Its changes are gone; retrying cannot help."""


# --- Kafka ---------------------------------------------------------------------------------


class SinkError(PgRouterError):
    """Producing to Kafka failed."""


class SinkUnavailable(SinkError):
    """Broker unreachable, leader changing, request timed out. Transient."""


@contextlib.contextmanager
def kafka_unusable(prefix: str):
    """Inside: a failure that is not a ``PgRouterError`` (whatever a Kafka client raises)
    becomes ``SinkUnavailable(prefix + its text)``: Kafka is not usable."""
    try:
        yield
    except PgRouterError:
        raise
    except Exception as exc:  # noqa: BLE001 — any client failure
        raise SinkUnavailable(f"{prefix}{exc}") from exc


class RecordTooLarge(SinkError):
    """A record exceeds what the topic accepts. Permanent: the data needs a config change."""


class RecordUnencodable(SinkError):
    """A value the configured record format cannot carry (a multi-dimensional array in a
    Connect record). Permanent: the message names table, column and value."""


class SinkRejected(SinkError):
    """Kafka refused the records for a reason retrying will not fix (authorization, invalid
    topic, fenced producer)."""


# --- applier (pgrouter apply: Kafka topics into another PostgreSQL) -----------------------


class ApplyError(PgRouterError):
    """Applying a source transaction to the target PostgreSQL failed for a reason retrying
    will not fix (a table or column missing on the target, a value it refuses)."""


class ApplyConflict(ApplyError):
    """A change does not fit the target's rows (insert of an existing key, update or delete
    of a missing row) and the conflict policy is ``error``."""


# --- the router's own run --------------------------------------------------------------


class GaveUp(PgRouterError):
    """Transient failures lasted longer than the command's retry budget
    (``pgrouter run --until-caught-up --retry-timeout``)."""


class Aborted(PgRouterError):
    """A second SIGTERM/SIGINT cut the drain short; nothing unacknowledged was confirmed."""

    def __init__(self, message: str = "aborted by a second signal while draining; records "
                 "Kafka had not acknowledged were not confirmed to the slot and are sent "
                 "again on the next start"):
        super().__init__(message)


class LeadershipLost(PgRouterError):
    """With ``[ha]``: this router no longer leads its group (its lease expired or Kafka took
    partition 0 away); it stops streaming without confirming or producing (router.delivery.ha)."""


# --- bugs ----------------------------------------------------------------------------------


class InternalError(PgRouterError):
    """An invariant of pgrouter itself was broken."""


#: Which failures the supervisor retries (with capped backoff). Everything not listed stops the
#: router with its message. Subclasses inherit their parent's entry.
RETRYABLE: dict[type[BaseException], bool] = {
    ConfigError: False,
    DecodeError: False,
    SourceUnavailable: True,
    AuthenticationFailed: False,
    DatabaseMissing: False,
    PrivilegeMissing: False,
    SlotInUse: False,
    SlotMissing: False,
    SlotBehind: False,
    PublicationMissing: False,
    SlotInvalidated: False,
    SourceError: True,
    SinkUnavailable: True,
    RecordTooLarge: False,
    RecordUnencodable: False,
    SinkRejected: False,
    SinkError: True,
    ApplyError: False,
    GaveUp: False,
    Aborted: False,
    LeadershipLost: False,
    InternalError: False,
}


def is_retryable(exc: BaseException) -> bool:
    """Look ``exc`` up in ``RETRYABLE`` by its most specific type."""
    for cls in type(exc).__mro__:
        if cls in RETRYABLE:
            return RETRYABLE[cls]
    return False
