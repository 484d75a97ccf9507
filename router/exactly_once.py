"""Exactly-once into Kafka: the progress record and the rules around it.

Rules (DESIGN.md "Exactly-once into Kafka"):

* Records are written inside Kafka transactions. A Kafka transaction holds the records of
  one or more *whole* source transactions and, last, one progress record: key = the
  transactional id, value = ``{"end_lsn": …}``, the end LSN of the last source transaction in
  it. Both become visible to ``read_committed`` consumers at the commit, or neither does.
* The progress topic is compacted with one partition; its newest committed value per key is
  the position up to which Kafka holds every change.
* On start the router reads that position with ``read_committed`` *after* its producer
  registered its transactional id (which aborts a predecessor's open transaction and fences
  it), and skips every source transaction whose end LSN is not past it: PostgreSQL resends
  what the slot had not confirmed, Kafka already holds it.
* The slot is confirmed only after the Kafka commit (the sink reports a transaction done from
  the commit, not from the record acknowledgements).
* A producer fenced by a newer one with the same transactional id stops with one line: it is
  never retried (a retry would fence the newer router in turn).
"""

from __future__ import annotations

import msgspec

from .errors import ConfigError, SinkRejected
from .lsn import format_lsn, parse_lsn

#: progress topic settings: one partition, compacted
PROGRESS_TOPIC_CONFIGS = {"cleanup.policy": "compact"}


class ProducerFenced(SinkRejected):
    """Another producer with the same transactional id took over (a second router)."""


def fenced_line(transactional_id: str) -> str:
    return (f"fenced: another router started with transactional id {transactional_id!r} and "
            "took over; this one stops (run one router per transactional id)")


class Progress(msgspec.Struct, frozen=True):
    """The value of a progress record."""

    end_lsn: str  # "X/Y", as PostgreSQL writes LSNs
    slot: str = ""


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Progress).decode


def progress_record(transactional_id: str, end_lsn: int, slot: str) -> tuple[bytes, bytes]:
    """(key, value) of the progress record for a Kafka transaction ending at ``end_lsn``."""
    return transactional_id.encode(), _encode(Progress(format_lsn(end_lsn), slot))


def read_progress(value: bytes | None) -> int:
    """The end LSN a progress record holds (0 for a tombstone)."""
    if not value:
        return 0
    try:
        return parse_lsn(_decode(value).end_lsn)
    except (msgspec.DecodeError, ValueError) as exc:
        raise ConfigError(f"the progress topic holds a record pgrouter did not write: {exc}",
                          path="kafka.progress_topic") from exc


def transactional_id(configured: str, slot: str) -> str:
    """``[kafka] transactional_id``, or one derived from the slot (one router per slot)."""
    return configured or f"pgrouter-{slot}"


def already_in_kafka(end_lsn: int, committed_lsn: int) -> bool:
    """A source transaction ending at ``end_lsn`` was committed to Kafka by an earlier run."""
    return end_lsn <= committed_lsn


def validate_exactly_once(kafka, *, source: str | None = None) -> None:
    """``[kafka]`` keys of the mode (both clients support Kafka transactions)."""
    if kafka.transaction_interval_ms < 0:
        raise ConfigError("must be ≥ 0", path="kafka.transaction_interval_ms", source=source)
    if kafka.transactional_id and not kafka.transactional_id.isprintable():
        raise ConfigError("must be printable", path="kafka.transactional_id", source=source)
    if not kafka.exactly_once:
        return
    others = {kafka.schema_topic, kafka.messages_topic, kafka.transactions_topic}
    if kafka.progress_topic in others:
        raise ConfigError("must differ from the schema, messages and transactions topics",
                          path="kafka.progress_topic", source=source)
