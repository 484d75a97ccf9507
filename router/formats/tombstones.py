"""Tombstones: the null-value record that follows a delete on a route with
``tombstones = true``, so a compacted topic (``cleanup.policy=compact``) forgets the key, as
Debezium's ``tombstones.on.delete`` does.

Rules:

* A tombstone is ``(topic, key, None, headers)``: the key and headers of the record it
  follows, no value — in every format (an Avro or Connect tombstone is a null Kafka value,
  no schema id, its key reshaped like the record's before it).
* It follows, in the same chunk, every delete record of such a route: a DELETE, an UPDATE a
  row filter turns into a delete, a repair's delete (``pgrouter verify --repair``); and an
  UPDATE that changes the key follows with a tombstone of the old key (the JSON format's one
  ``u`` record leaves the old key otherwise; Avro and Connect write that update as a delete
  and a create, the tombstone then comes after both).
* TRUNCATE gets none: pgrouter does not know the truncated keys (Debezium writes none either).
  A compacted topic keeps the truncated rows' last records and its latest truncate record.
  In Avro and Connect a truncate record has a null Kafka key, which a compacted topic
  refuses (the broker's INVALID_RECORD, every time the router reaches it): a route of such
  a format whose ``topic_settings`` compact its topics and that publishes TRUNCATE is a
  ``ConfigError`` (``validate_compacted``). The JSON format's truncate key is ``null``, the
  JSON text: accepted. A topic made compacted outside pgrouter is not in the config: Kafka's
  refusal (``INVALID_RECORD``) is said in one line naming the topic and the two ways out
  (``keyless_refused``).
* Routes without tombstones pay nothing: their changes keep the recorders' direct path; only
  a route with tombstones sends its deletes and updates through ``ChangeRouter._route_change``.
* The reshapers (``router.formats.avro``, ``router.formats.connect``) see a tombstone alone (a
  record whose value is None); the record before it in the same list is the one it follows, which
  names the table layout (``Preceding``).
"""

from __future__ import annotations

import msgspec

from ..errors import ConfigError, SinkRejected

_decode = msgspec.json.decode


def validate_compacted(route, where: str, source: str, fmt: str) -> None:
    """A route whose records a compacted topic would refuse: TRUNCATE's null key in Avro or
    Connect on topics ``topic_settings`` compact."""
    policy = route.topic_settings.configs.get("cleanup.policy", "")
    if (fmt in ("avro", "connect") and "truncate" in route.operations
            and "compact" in policy.replace(" ", "").split(",")):
        raise ConfigError(
            f'a TRUNCATE record has a null key in format "{fmt}" and a compacted topic '
            "refuses records without a key: leave truncate out of operations (as Debezium's "
            'default skipped.operations=t does) or use format "json"', path=f"{where}.operations",
            source=source)


def keyless_refused(topic: str | None, kafka_error: str) -> SinkRejected:
    """Kafka's ``INVALID_RECORD`` for records of ``topic`` (None: not known): what a
    compacted topic says of a record without a key, as a TRUNCATE record is in Avro and
    Connect."""
    where = "" if topic is None else f" of topic {topic}"
    return SinkRejected(
        f"Kafka refused the records{where} as invalid ({kafka_error}): a compacted topic "
        "(cleanup.policy=compact) refuses a record without a key, as a TRUNCATE record is in "
        'format "avro" and "connect"; leave "truncate" out of the operations of the route '
        "writing to it (as Debezium's default skipped.operations=t does), make the topic "
        'not compacted, or use format "json"')


def after_record(record: tuple, out: list) -> None:
    """The tombstone of ``record`` (a delete just appended to ``out``) appended too."""
    out.append((record[0], record[1], None, record[3]))


def after_update(encoder, record: tuple, old: tuple | None, old_is_key: bool,
                 out: list) -> None:
    """A tombstone of the old key when the update ``record`` (just appended) changed the
    key. An identity index without the primary key (``TableEncoder._delete_key``) logs an old
    tuple that does not hold the old key: nothing is known, nothing is written."""
    if old is None or (old_is_key and encoder._delete_key is not None):
        return
    if encoder.transform is not None:  # the key as the record's was made (router.routing.transforms)
        old = encoder.transform(old)
    old_key = encoder.key(old)
    if old_key != record[1] and old_key != b"null":
        out.append((record[0], old_key, None, record[3]))


class Preceding:
    """Tombstones reshaped for a reshaper: it is called back with the tombstone only (the C
    converter declines a null value), in list order, so a cursor finds the record before it
    (the one it follows, naming its table layout) in one pass over the list. ``key_of
    (schema_id, topic, key dict)`` is the key in the reshaper's format (None: no schema id
    yet, the reshaper's ``SchemasNeeded``)."""

    __slots__ = ("records", "at", "key_of")

    def __init__(self, records: list, key_of):
        self.records, self.at, self.key_of = records, 0, key_of

    def schema_id(self, tombstone: tuple) -> str:
        """The ``schema_id`` of the record the tombstone follows (its table layout)."""
        records, i = self.records, self.at
        n = len(records)
        while i < n and records[i] is not tombstone:
            i += 1
        self.at = i + 1
        j = i - 1
        while j >= 0 and records[j][2] is None:  # a key change's tombstone after a delete's
            j -= 1
        if i >= n or j < 0:
            raise ValueError("a tombstone without the record it follows")
        return _decode(records[j][2])["source"]["schema_id"]

    def reshape(self, record: tuple) -> tuple | None:
        """The tombstone ``record`` in the reshaper's format."""
        topic, key, _, headers = record
        if key is None:
            return record
        new_key = self.key_of(self.schema_id(record), topic, _decode(key))
        return None if new_key is None else (topic, new_key, None, headers)
