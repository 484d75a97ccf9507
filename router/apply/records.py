"""pgrouter's records as the applier reads them back from Kafka: the data envelope
(``router.formats.envelope``) and the transaction topic's BEGIN/END
(``router.routing.transaction_meta``), decoded once with msgspec into typed structs. Rows stay JSON
text until asked for.

The structs hold no reference cycles and are left out of the garbage collector's scans
(``gc=False``): an applier holds many of them, and scanning them cost more than decoding.
"""

from __future__ import annotations

import msgspec


class RecordSource(msgspec.Struct, gc=False):
    commit_lsn: int | None = None
    seq: int = 0
    #: 0 on initial-snapshot rows (``router.snapshot.core``)
    xid: int | None = None
    schema: str | None = None
    table: str | None = None
    route: str = ""
    schema_id: str | None = None


_NULL = msgspec.Raw(b"null")
_decode_row = msgspec.json.Decoder(dict | None).decode


class DataRecord(msgspec.Struct, gc=False):
    """The fields of a pgrouter envelope (``router.formats.envelope``) the applier needs. The rows
    stay JSON text until asked for (``before`` / ``after`` decode them): an insert can go
    to the target as that text (``router.apply.batches``)."""

    op: str
    source: RecordSource
    before_json: msgspec.Raw = msgspec.field(name="before", default=_NULL)
    after_json: msgspec.Raw = msgspec.field(name="after", default=_NULL)
    # no ``unchanged_toast``: those columns are absent from ``after``, so left alone; and an
    # empty list a record was an object a record for the garbage collector to scan
    truncate: dict | None = None

    @property
    def before(self) -> dict | None:
        return _decode_row(self.before_json)

    @property
    def after(self) -> dict | None:
        return _decode_row(self.after_json)


class DataCollection(msgspec.Struct, gc=False):
    data_collection: str
    event_count: int


class MetaSource(msgspec.Struct, gc=False):
    commit_lsn: int
    xid: int
    commit_time: str
    end_lsn: int = 0
    origin: str | None = None


class TransactionRecord(msgspec.Struct, gc=False):
    status: str
    id: str
    source: MetaSource
    event_count: int | None = None
    data_collections: list[DataCollection] | None = None


_decode_data = msgspec.json.Decoder(DataRecord).decode
_decode_meta = msgspec.json.Decoder(TransactionRecord).decode
