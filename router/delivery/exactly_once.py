"""Exactly-once into Kafka: the committed-LSN record and the rules around it.

Rules (docs/architecture.md "Exactly-once", docs/delivery.md):

* Records are written inside Kafka transactions. A Kafka transaction holds the records of
  one or more *whole* source transactions and, last, one committed-LSN record: key = the
  transactional id, value = ``{"end_lsn": …}``, the end LSN of the last source transaction in
  it. Both become visible to ``read_committed`` consumers at the commit, or neither does.
* The committed-LSN topic is compacted with one partition; its newest committed value per key is
  the position up to which Kafka holds every change.
* On start the router reads that position with ``read_committed`` *after* its producer
  registered its transactional id (which aborts a predecessor's open transaction and fences
  it), and skips every source transaction whose end LSN is not past it: PostgreSQL resends
  what the slot had not confirmed, Kafka already holds it.
* The slot is confirmed only after the Kafka commit (the sink reports a transaction done from
  the commit, not from the record acknowledgements).
* A producer fenced by a newer one with the same transactional id stops with one line: it is
  never retried (a retry would fence the newer router in turn).
* A committed LSN belongs to one *stream*: the server's system identifier, the database and
  the slot (``Stream``). The default transactional id names all three, and the committed-LSN
  record names them: a committed-LSN record of another stream under the configured id is
  refused (two slots, or two servers, on one transactional id would skip each other's
  transactions), and so is a position past the server's WAL end (a committed LSN this server
  cannot have written: another cluster, or a restored one). A record without a stream
  (written before pgrouter recorded it) is not used: it cannot say whose position it holds.
"""

from __future__ import annotations

import msgspec

from ..errors import ConfigError, SinkRejected, SinkUnavailable
from ..postgres.lsn import format_lsn, parse_lsn

#: longest ``[kafka] transaction_interval_ms``: a Kafka transaction stays open at most this
#: long plus the time to send its last source transaction, well inside the producer's
#: ``transaction.timeout.ms`` (60 s)
MAX_TRANSACTION_INTERVAL_MS = 30_000

#: committed-LSN topic settings: one partition, compacted
COMMITTED_TOPIC_CONFIGS = {"cleanup.policy": "compact"}


class ProducerFenced(SinkRejected):
    """Another producer with the same transactional id took over (a second router)."""


def fenced_line(transactional_id: str) -> str:
    return (f"fenced: another router started with transactional id {transactional_id!r} and "
            "took over; this one stops (run one router per transactional id)")


class TransactionTimedOut(SinkUnavailable):
    """The broker aborted the open Kafka transaction: it stayed open longer than the
    producer's ``transaction.timeout.ms`` (the router was paused). Retried: the pipeline
    restarts from what Kafka committed."""


def timed_out_line(transactional_id: str, timeout_ms: int) -> str:
    return (f"Kafka aborted the open transaction of transactional id {transactional_id!r}: it "
            f"stayed open longer than transaction.timeout.ms ({timeout_ms} ms: the router was "
            "paused, e.g. SIGSTOP or a frozen host, or one source transaction took that long to "
            "send; if it recurs raise [kafka.settings] transaction_timeout_ms); restarting from "
            "what Kafka committed")


class TransactionLost(SinkUnavailable):
    """The Kafka client aborted the open transaction itself after an error it recovers from
    (kafka-python bumps the producer's epoch, KIP-360; librdkafka: an abortable error).
    Retried: the pipeline restarts from what Kafka committed."""


def lost_line(transactional_id: str, cause: BaseException) -> str:
    return (f"the Kafka client aborted the open transaction of transactional id "
            f"{transactional_id!r} after an error ({cause}); restarting from what Kafka "
            "committed")


class Stream(msgspec.Struct, frozen=True):
    """What a router's changes come from: one slot of one database of one server."""

    system_id: str  # pg_control_system().system_identifier
    db: str
    slot: str

    def describe(self) -> str:
        return f"slot {self.slot!r} of database {self.db!r} on server {self.system_id}"


class Committed(msgspec.Struct, frozen=True, omit_defaults=True):
    """The value of a committed-LSN record."""

    end_lsn: str  # "X/Y", as PostgreSQL writes LSNs
    slot: str = ""
    system_id: str = ""
    db: str = ""


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Committed).decode


def committed_record(transactional_id: str, end_lsn: int, stream: Stream) -> tuple[bytes, bytes]:
    """(key, value) of the committed-LSN record for a Kafka transaction ending at ``end_lsn``."""
    return transactional_id.encode(), _encode(Committed(format_lsn(end_lsn), stream.slot,
                                                       stream.system_id, stream.db))


def decode_committed(value: bytes | None) -> Committed | None:
    """A committed-LSN record's value (None for a tombstone or no record)."""
    if not value:
        return None
    try:
        committed = _decode(value)
        parse_lsn(committed.end_lsn)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"the committed-LSN topic holds a record pgrouter did not write: {exc}",
                          path="kafka.committed_lsn_topic") from exc
    return committed


def foreign_stream(committed: Committed | None, stream: Stream) -> bool:
    """Whether ``committed`` was written by a router of another stream."""
    return committed is not None and bool(committed.system_id) and (
        (committed.system_id, committed.db, committed.slot)
        != (stream.system_id, stream.db, stream.slot))


def shared_id_line(transactional_id: str, committed: Committed, stream: Stream) -> str:
    theirs = Stream(committed.system_id, committed.db, committed.slot)
    return (f"transactional id {transactional_id!r} holds the committed LSN of "
            f"{theirs.describe()}; "
            f"this router streams {stream.describe()}: two streams on one transactional id "
            "would skip each other's transactions; give each router its own [kafka] "
            "transactional_id (or leave it empty: the default names the stream)")


def committed_lsn(transactional_id: str, committed: Committed | None, stream: Stream,
                  wal_end: int) -> int:
    """The end LSN up to which Kafka holds ``stream`` (0: nothing usable); refuses another
    stream's committed and a position past the server's WAL end."""
    if committed is None or not committed.system_id:
        return 0  # no record, or one that cannot say whose it is (an older pgrouter's)
    if foreign_stream(committed, stream):
        raise ConfigError(shared_id_line(transactional_id, committed, stream),
                          path="kafka.transactional_id")
    lsn = parse_lsn(committed.end_lsn)
    if lsn > wal_end:
        raise ConfigError(f"the committed-LSN topic says Kafka holds {stream.describe()} up to "
                          f"{committed.end_lsn}, past the server's WAL end {format_lsn(wal_end)}:"
                          " that committed LSN was not written from this server's WAL (a restored "
                          "or rebuilt cluster keeps its system identifier); skipping by it "
                          "would lose transactions. Use a new [kafka] transactional_id (or "
                          "committed_lsn_topic) for this server",
                          path="kafka.committed_lsn_topic")
    return lsn


def transactional_id(configured: str, stream: Stream) -> str:
    """``[kafka] transactional_id``, or one naming the stream (one router per stream): two
    servers or databases with the same slot name never share one by default."""
    return configured or f"pgrouter-{stream.slot}-{stream.db}-{stream.system_id}"


def already_in_kafka(end_lsn: int, committed_lsn: int) -> bool:
    """A source transaction ending at ``end_lsn`` was committed to Kafka by an earlier run."""
    return end_lsn <= committed_lsn


def validate_exactly_once(kafka, *, source: str | None = None) -> None:
    """``[kafka]`` keys of the mode (both clients support Kafka transactions)."""
    if kafka.transaction_interval_ms < 0:
        raise ConfigError("must be ≥ 0", path="kafka.transaction_interval_ms", source=source)
    if kafka.transaction_interval_ms > MAX_TRANSACTION_INTERVAL_MS:
        raise ConfigError(f"must be ≤ {MAX_TRANSACTION_INTERVAL_MS} (half of the 60 s a Kafka "
                          "transaction may stay open, transaction.timeout.ms: a longer one is "
                          "aborted by the broker, which fences the router)",
                          path="kafka.transaction_interval_ms", source=source)
    if kafka.transactional_id and not kafka.transactional_id.isprintable():
        raise ConfigError("must be printable", path="kafka.transactional_id", source=source)
    if not kafka.exactly_once:
        return
    others = {kafka.schema_topic, kafka.messages_topic, kafka.transactions_topic}
    if kafka.committed_lsn_topic in others:
        raise ConfigError("must differ from the schema, messages and transactions topics",
                          path="kafka.committed_lsn_topic", source=source)
