"""Delivery accounting between the sink and its Kafka client.

The client contract reports per batch, not per record: ``produce(records, ticket, on_done)``
calls ``on_done(ticket, None, len(records))`` once when Kafka acknowledged every record of
the batch, or ``on_done(ticket, error, 0)`` at the first failure, and nothing after that.
A failure reported with its record (``tally(err, msg)``: librdkafka) is held until every
record of the batch is reported, then ``on_done(ticket, error, 0, msg)`` names the largest
record that failed (``len(msg)``): a batch the broker refused as too large fails every
record in it, and the line should name the one that did not fit.
``Tally`` turns the clients' per-record callbacks into that: ``tally(err, msg)`` is
librdkafka's delivery callback, ``tally.ack(metadata)``/``tally.fail(exc)`` kafka-python's.

Rules:

* A Tally fires at most once. It is made for a batch before any record of it is handed over,
  so a record acknowledged at once cannot complete a batch too early.
* The per-record work is a decrement; in C (``router._native.Tally``) when it is built, as
  the client's thread runs it for every record.
"""

from __future__ import annotations

import msgspec

from ..errors import RecordTooLarge
from ..native import NATIVE

#: characters of a record key shown in an error line
KEY_SHOWN = 120


class PyTally:
    """``router._native.Tally`` in Python (the reference, and the fallback)."""

    __slots__ = ("count", "left", "fired", "on_done", "ticket", "failed")

    def __init__(self, count: int, on_done, ticket):
        if count < 0:
            raise ValueError("Tally: negative count")
        self.count = self.left = count
        self.fired = False
        self.on_done = on_done
        self.ticket = ticket
        self.failed = None  # (size, err, msg) of the largest failed record reported

    def __call__(self, err, msg=None):
        if err is None:
            return self.ack()
        if msg is None:
            return self.fail(err)
        if self.fired:
            return
        try:
            size = len(msg)
        except TypeError:
            size = 0
        if self.failed is None or size > self.failed[0]:
            self.failed = (size, err, msg)
        return self.ack()

    def ack(self, *ignored):
        if self.fired:
            return
        self.left -= 1
        if self.left <= 0:
            self.fired = True
            if self.failed is not None:
                self.on_done(self.ticket, self.failed[1], 0, self.failed[2])
            else:
                self.on_done(self.ticket, None, self.count)

    def fail(self, err):
        if self.fired:
            return
        self.fired = True
        self.on_done(self.ticket, err, 0)


class _Source(msgspec.Struct):
    schema: str = "?"
    table: str = "?"


class _Envelope(msgspec.Struct):
    source: _Source | None = None


_envelope = msgspec.json.Decoder(_Envelope).decode


def _table(value: bytes | None) -> str:
    """``schema.table`` from a record's envelope (``source``), or what it is instead."""
    try:
        source = _envelope(value or b"").source
    except (msgspec.DecodeError, TypeError):
        return "(not a change record)"
    return "(none)" if source is None else f"{source.schema}.{source.table}"


def _key(key: bytes | None) -> str:
    if key is None:
        return "null"
    text = bytes(key).decode("utf-8", "replace")
    return text if len(text) <= KEY_SHOWN else f"{text[:KEY_SHOWN]}… ({len(key)} bytes)"


#: what to change when a topic's limit is the one in the way
TOPIC_FIX = ("raise the topic's max.message.bytes (routes[].topic_settings.configs when "
             "pgrouter creates it, kafka-configs.sh --alter when it exists; the broker's "
             "default is message.max.bytes)")


def record_too_large(topic: str, key: bytes | None, value: bytes | None, *,
                     headers: list | None = None, owner: str | None = None,
                     producer_limit: int | None = None,
                     topic_limit: int | None = None) -> RecordTooLarge:
    """The one line for a record Kafka will not take: where it was going, which row, how
    big, and what to change. ``producer_limit``: the producer's own request size limit
    refused it; ``topic_limit``: it is above the topic's ``max.message.bytes``; neither:
    the broker refused it for the topic. ``owner``: what made the topic's records when
    they are not change records (an outbox route's events: its route and table; the event
    id is read from ``headers``). The error keeps the record and the limits
    (``record``, ``limits``) for the sink to name the owner it knows."""
    size = len(value or b"") + len(key or b"")
    if owner is not None:
        what = f"{owner}{_event_id(headers)}"
    else:  # a dead letter's table is a header
        table = dict(headers or ()).get("pgrouter.table")
        what = f"table {_table(value) if table is None else bytes(table).decode()}"
    where = f"topic {topic}, {what}, key {_key(key)}: {size} bytes"
    if topic_limit is not None:
        why = f"above the topic's max.message.bytes of {topic_limit} bytes; {TOPIC_FIX}"
    elif producer_limit is not None:
        why = (f"above the producer's limit of {producer_limit} bytes; raise [kafka.settings] "
               "max_request_size (librdkafka: message.max.bytes), and the topic's "
               "max.message.bytes if it is smaller")
    else:
        why = (f"refused by the broker as larger than the topic accepts; {TOPIC_FIX}, "
               "keeping [kafka.settings] batch_size below it")
    error = RecordTooLarge(f"record too large for Kafka: {where}, {why}")
    error.record = (topic, key, value, headers)
    error.limits = {"producer_limit": producer_limit, "topic_limit": topic_limit}
    return error


def _event_id(headers) -> str:
    for name, value in headers or ():
        if name == "id":
            return ", event id " + ("null" if value is None else _key(value))
    return ""


#: what clients use: the C Tally when built
Tally = NATIVE.Tally if NATIVE is not None else PyTally
