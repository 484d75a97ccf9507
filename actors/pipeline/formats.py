"""The record formats the sink writes (``[kafka] format``): how a chunk's records are
encoded, whatever their source (stream, initial snapshot, backfill, exactly-once, and
``pgrouter verify``, which encodes rows as the sink would).

Rules:

* What the format is comes from ``router.formats.record_format`` (the one place that reads
  ``[kafka] format``); ``record_format`` builds its encoder, which the sink is handed.
* ``"json"``: pgrouter's JSON, the records as the router made them (packed ones too);
  ``"connect"``: Kafka Connect's JSON (``router.formats.connect``); ``"avro"``: Avro in the
  Confluent wire format (``router.formats.avro``), each schema registered once before the first
  record naming it (``AvroRecords.register``, called by the sink in a worker thread).
* Key and value are reshaped alike, so a row's snapshot record and its changes share key
  bytes and partition.
* A schema the registry refuses stops the sink with one line: the table, the columns that
  changed since the layout last registered there, the subject and its compatibility level.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Protocol

from router.formats.record_format import FORMATS
from router.formats.record_format import record_format as format_of
from router.routing.change_router import RoutedChunk

from ..kafka.registry import RegistryClient, SchemaIncompatible
from ..services import log

if TYPE_CHECKING:  # Avro's and Connect's modules load when a route writes them, not before
    from router.formats.avro import Subject

_log = log.get("sink")


class RecordFormat(Protocol):
    """``chunk -> records`` in the configured format (``router.formats.record_format``'s traits)."""

    #: the ``[kafka] format`` value
    name: str
    #: records name their schemas by a registry id: ``convert`` raises
    #: ``router.formats.avro.SchemasNeeded`` until ``register`` gave them one
    registers: bool
    #: records may stay as the router packed them (an initial snapshot's, produced in C)
    packs: bool

    def __call__(self, chunk: RoutedChunk) -> list:
        """The chunk's records encoded (its new table layouts learned first)."""

    def learn(self, chunk: RoutedChunk) -> None:
        """The table layouts ``chunk`` publishes, known before its records are converted."""

    def convert(self, records: list) -> list:
        """``records`` encoded (callable from the producing thread)."""

    def register(self, subjects) -> None:
        """The registry ids of ``subjects`` asked for (blocking: a worker thread's)."""


class JsonRecords:
    """pgrouter's JSON: the records as the router made them."""

    name, registers, packs = FORMATS["json"]

    def __call__(self, chunk: RoutedChunk) -> list:
        return chunk.records

    def learn(self, chunk: RoutedChunk) -> None:
        pass

    def convert(self, records: list) -> list:
        return records

    def register(self, subjects) -> None:
        pass


class ConnectRecords:
    """Kafka Connect's JSON (``router.formats.connect``)."""

    name, registers, packs = FORMATS["connect"]

    def __init__(self):
        from router.formats.connect import ConnectFormat
        self.format = ConnectFormat()

    def __call__(self, chunk: RoutedChunk) -> list:
        self.learn(chunk)
        return self.format.convert_all(chunk.records)

    def learn(self, chunk: RoutedChunk) -> None:
        for schema in chunk.schemas:
            self.format.learn(schema)

    def convert(self, records: list) -> list:
        return self.format.convert_all(records)

    def register(self, subjects) -> None:
        pass


class AvroRecords:
    """``chunk -> records`` in Avro (``router.formats.avro``), raising ``SchemasNeeded`` for schemas
    without an id; ``register`` (blocking: a worker thread's) asks the registry for them."""

    name, registers, packs = FORMATS["avro"]

    def __init__(self, registry_cfg, client=None):
        from router.formats.avro import AvroFormat
        self.format = AvroFormat(registry_cfg.subject_naming)
        self.client = client or RegistryClient(registry_cfg)
        self._last: dict[str, Subject] = {}  # subject -> the layout last registered there

    def __call__(self, chunk: RoutedChunk) -> list:
        self.learn(chunk)
        return self.convert(chunk.records)

    def learn(self, chunk: RoutedChunk) -> None:
        for schema in chunk.schemas:
            self.format.learn(schema)

    def convert(self, records: list) -> list:
        """``records`` in Avro (callable from the producing thread: the C conversion lets
        the router's thread run meanwhile); ``SchemasNeeded`` names what has no id yet."""
        return self.format.convert_all(records)

    def register(self, subjects) -> None:
        for subject in subjects:
            try:
                schema_id = self.client.register(subject.subject, subject.schema)
            except SchemaIncompatible as exc:
                before = self._last.get(subject.subject)
                latest = None if before is not None else self.client.latest(subject.subject)
                raise SchemaIncompatible(incompatible_line(subject, before, exc, latest),
                                         subject=exc.subject, level=exc.level) from None
            self.format.set_id(subject, schema_id)
            self._last[subject.subject] = subject
            log.event(_log, "schema registered", subject=subject.subject, id=schema_id,
                      table=subject.table or None)


#: the encoder of each record format
ENCODERS: dict[str, type[JsonRecords] | type[ConnectRecords] | type[AvroRecords]] = {
    c.name: c for c in (JsonRecords, ConnectRecords, AvroRecords)}


def record_format(cfg) -> RecordFormat:
    """How every sink encodes records for ``cfg``, whatever their source (stream, initial
    snapshot, backfill, exactly-once): the one object a pipeline's sink uses."""
    cls = ENCODERS[format_of(cfg.kafka).name]
    if cls is AvroRecords:
        return AvroRecords(cfg.kafka.registry)
    return ConnectRecords() if cls is ConnectRecords else JsonRecords()


def incompatible_line(subject: Subject, before: Subject | None, exc,
                      latest: str | None = None) -> str:
    """One line for a schema the registry refused: table, columns that changed (since the
    layout this process registered there, else since the subject's latest schema), subject
    and compatibility level."""
    old: dict[str, str] | None = None
    new: dict[str, str] = {}
    if before is not None:
        old, new = dict(before.columns), dict(subject.columns)
    elif latest is not None:
        old, new = _row_fields(latest), _row_fields(subject.schema)
    if old is not None:
        changes = ([f"column {c} added ({t})" for c, t in new.items() if c not in old]
                   + [f"column {c} dropped" for c in old if c not in new]
                   + [f"column {c} retyped {old[c]} -> {t}" for c, t in new.items()
                      if c in old and old[c] != t])
    else:
        changes = [f"columns {', '.join(f'{c} {t}' for c, t in subject.columns)}"]
    what = "; ".join(changes) or "the layout changed"
    return (f"table {subject.table}: {what}: the schema registry refused the new {subject.kind} "
            f"schema for subject {exc.subject!r} under compatibility {exc.level} ({exc}); "
            "nothing after the last delivered record is confirmed: relax the subject's "
            "compatibility (or register a compatible schema) and start the router again")


def _row_fields(schema_text: str) -> dict[str, str]:
    """column -> its Avro type in words, of a key record or an envelope's row record."""
    from router.formats.avro import COLUMN_PROP
    try:
        schema = json.loads(schema_text)
        fields = schema["fields"]
        for f in fields:
            if f["name"] == "before":
                fields = [t for t in f["type"] if isinstance(t, dict)][0]["fields"]
                break
        return {f.get(COLUMN_PROP, f["name"]): _type_words(f["type"]) for f in fields}
    except (ValueError, KeyError, IndexError, TypeError):
        return {}


def _type_words(t) -> str:
    if isinstance(t, list):  # ["null", T]
        return " | ".join(_type_words(x) for x in t if x != "null")
    if isinstance(t, dict):
        if t.get("type") == "array":
            return f"array of {_type_words(t.get('items'))}"
        return t.get("logicalType") or t.get("connect.name") or str(t.get("type"))
    return str(t)
