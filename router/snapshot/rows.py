"""Snapshot rows to Kafka records, route by route (``op: "r"``).

Rules:

* The plans are the router's (``ChangeRouter.plans_for`` over route specs that describe the
  initial copy, ``actors.snapshot.tables``): a row is published to a route when the route's
  insert filter passes it (NULL counts as false), mapped to the ancestor's columns when the
  route publishes via the root, projected to the route's column list by its encoder.
* Positions come from the caller (``router.snapshot.core``): ``first_seq`` is the row ordinal's
  base, the n-th row of a batch gets ``first_seq + n`` on every route.
* Each batch becomes one ``RoutedChunk`` (a "transaction" of its own that confirms
  ``end_lsn``), listing the schemas and topics not used before by this encoder.
* A table whose every route takes its rows as they are (no filter, no mapping to a root) and
  whose columns the C encoder formats exactly (no float column: its JSON is msgspec's repr,
  made in Python) is decided up front (``text_path``) to go from COPY text to records in C,
  a batch at a time, without the GIL (``router._native.copy_records``, the bytes of the
  streaming recorder's records; its twin ``copy_records_py``): the readers hand it the COPY
  text itself (``CopyText``). A batch the C side declines (escapes COPY never writes, text
  that is not UTF-8, a non-canonical integer) is parsed and encoded by the Python path.
* ``packed`` (the sink's client produces them in C: ``actors.kafka.native_producer``): such a
  batch's records stay packed, one ``RecordBlock`` a route (their bytes and offsets, no
  object a record), the chunk's records a ``PackedRecords``. Both are sequences of the
  same ``(topic, key, value, headers)`` records for any other reader.
"""

from __future__ import annotations

from ..stream.changes import Change
from ..formats.envelope import TableEncoder, TxContext
from ..native import NATIVE
from ..routing.plans import apply_plan
from ..pgoutput import Relation
from ..formats.recorders import PyRecorder
from ..routing.change_router import ChangeRouter, RoutedChunk
from .core import copy_rows, copy_rows_py
from ..formats import tombstones
from ..formats.values import FLOAT4, FLOAT8

_H_LSN, _H_SEQ = "pgrouter.commit_lsn", "pgrouter.seq"


class CopyText:
    """Whole lines of COPY text (``rows`` of them) for a table on the C path."""

    __slots__ = ("data", "rows")

    def __init__(self, data: bytes, rows: int):
        self.data, self.rows = data, rows

    def __len__(self) -> int:
        return self.rows


class RecordBlock:
    """One route's records of a batch, packed (``copy_records(..., packed=True)``): every
    record's key and value back to back in ``data``, three native 64-bit offsets a record
    (key start, value start, end) in ``offsets``; the n-th record's seq is ``first_seq + n``
    and its headers are ``[lsn_header, (seq_name, seq)]`` (none without ``lsn_header``)."""

    __slots__ = ("topic", "data", "offsets", "lsn_header", "seq_name", "first_seq", "rows")

    def __init__(self, topic: str, data: bytes, offsets: bytes, lsn_header: tuple | None,
                 seq_name: str, first_seq: int):
        self.topic, self.data, self.offsets = topic, data, offsets
        self.lsn_header, self.seq_name, self.first_seq = lsn_header, seq_name, first_seq
        self.rows = len(offsets) // 24

    def __len__(self) -> int:
        return self.rows

    def __iter__(self):
        at = memoryview(self.offsets).cast("q")
        data, topic, lsn_header = self.data, self.topic, self.lsn_header
        for i in range(self.rows):
            k, v, e = at[3 * i], at[3 * i + 1], at[3 * i + 2]
            headers = None if lsn_header is None else [
                lsn_header, (self.seq_name, b"%d" % (self.first_seq + i))]
            yield topic, data[k:v], data[v:e], headers


class PackedRecords:
    """A chunk's records as ``RecordBlock``s (route after route)."""

    __slots__ = ("blocks", "rows")

    def __init__(self, blocks: list[RecordBlock]):
        self.blocks = blocks
        self.rows = sum(b.rows for b in blocks)

    def __len__(self) -> int:
        return self.rows

    def __iter__(self):
        for block in self.blocks:
            yield from block

    def sizes(self) -> list[tuple[str, int, int]]:
        """(topic, records, key and value bytes) of each block."""
        return [(b.topic, b.rows, len(b.data)) for b in self.blocks]


class SnapshotRows:
    def __init__(self, router: ChangeRouter, *, position_headers: bool = False,
                 packed: bool = False):
        self.router = router
        self.position_headers = position_headers
        #: C-path batches stay packed (``PackedRecords``): the sink's client produces them
        self.packed = packed
        self._schemas: set[str] = set()
        self._topics: set[str] = set()
        self._text: dict[int, bool] = {}  # relation id -> on the C path

    def routed(self, relation: Relation) -> bool:
        """Some route takes rows of ``relation``."""
        return bool(self.router.plans_for(relation))

    def text_path(self, relation: Relation) -> bool:
        """Rows of ``relation`` go from COPY text to records in C (decided once a table)."""
        known = self._text.get(relation.relation_id)
        if known is None:
            plans = self.router.plans_for(relation)
            known = self._text[relation.relation_id] = NATIVE is not None and bool(plans) and all(
                p.insert_filter is None and p.row_map is None and _c_layout(p.encoder)
                for p in plans)
        return known

    def _announce(self, plan, schemas: list, new_topics: list) -> None:
        sid = plan.encoder.schema.schema_id
        if sid not in self._schemas:
            self._schemas.add(sid)
            schemas.append(plan.encoder.schema)
        if plan.topic not in self._topics:
            self._topics.add(plan.topic)
            new_topics.append((plan.topic, plan.route))

    def text_parts(self, relation: Relation, tx: TxContext) -> list:
        """What ``encode_text`` needs of each route (made in the caller's thread: it binds
        the encoders to ``tx``); ``relation`` is on the C path (``text_path``)."""
        lsn_header = (_H_LSN, b"%d" % tx.commit_lsn) if self.position_headers else None
        parts = []
        for plan in self.router.plans_for(relation):
            plan.encoder.recorder(tx, plan.topic, lsn_header, _H_SEQ)  # binds it to tx
            e = plan.encoder
            parts.append((plan, (e._codec, plan.topic, e._head, e._mid, e._tail, lsn_header)))
        return parts

    def text_chunk(self, parts: list, records: list, tx: TxContext,
                   last: bool = True) -> RoutedChunk:
        """The chunk of ``encode_text``'s records."""
        schemas: list = []
        new_topics: list = []
        for plan, _ in parts:
            self._announce(plan, schemas, new_topics)
        return RoutedChunk(tx.xid, tx.commit_lsn, tx.end_lsn, records, schemas, last,
                           new_topics)

    def chunk(self, relation: Relation, rows: list[tuple] | CopyText, tx: TxContext,
              first_seq: int, *, last: bool = True, repair: bool = False) -> RoutedChunk:
        """The records of ``rows`` for every route taking ``relation``. ``repair`` (the rows
        of a repair's keys, ``pgrouter verify --repair``): a row a route's row filter rejects
        gets a delete record of its key instead, at the row's position — its topic holds the
        key (verify saw it there) and a consumer must not."""
        if type(rows) is CopyText and repair:
            rows = copy_rows(rows.data)
        if type(rows) is CopyText:
            parts = self.text_parts(relation, tx)
            records = encode_text(parts, rows.data, tx.end_lsn, first_seq, self.packed)
            if records is not None:
                return self.text_chunk(parts, records, tx, last)
            rows = copy_rows(rows.data)
        plans = self.router.plans_for(relation)
        records: list = []
        schemas = []
        new_topics = []
        lsn_header = (_H_LSN, b"%d" % tx.commit_lsn) if self.position_headers else None
        lsn = tx.end_lsn
        for plan in plans:
            self._announce(plan, schemas, new_topics)
            record = plan.encoder.recorder(tx, plan.topic, lsn_header, _H_SEQ)
            direct = plan.insert_filter is None and plan.row_map is None
            seq = first_seq
            drop = repair and plan.publish_insert and plan.publish_delete
            for row in rows:
                if direct:
                    records.append(record("r", lsn, seq, None, False, row))
                else:
                    r = apply_plan(plan, Change("insert", lsn, relation, None, False, row))
                    if r is not None:
                        records.append(record("r", lsn, seq, None, False, r[3]))
                    elif drop:  # the route's filter rejects it: a delete of its key
                        records.append(record("d", lsn, seq, _key_only(plan, row), True,
                                              None))
                        if plan.tombstones:
                            tombstones.after_record(records[-1], records)
                seq += 1
        return RoutedChunk(tx.xid, tx.commit_lsn, tx.end_lsn, records, schemas, last,
                           new_topics)

    def deletes(self, relation: Relation, keys: list[tuple], key_at: tuple[int, ...],
                tx: TxContext, first_seq: int) -> RoutedChunk:
        """Delete records of ``keys`` (text values of the key columns, at ``key_at`` in the
        relation's columns) for every route taking ``relation`` that publishes DELETE: a
        repair's keys the table no longer holds (``pgrouter verify --repair``). No filter is
        evaluated: the row is gone, only its key is known."""
        records: list = []
        lsn = tx.end_lsn
        width = len(relation.columns)
        lsn_header = (_H_LSN, b"%d" % tx.commit_lsn) if self.position_headers else None
        for plan in self.router.plans_for(relation):
            if not plan.publish_delete:
                continue
            record = plan.encoder.recorder(tx, plan.topic, lsn_header, _H_SEQ)
            seq = first_seq
            for key in keys:
                old = [None] * width
                for i, v in zip(key_at, key):
                    old[i] = v
                if plan.row_map is not None:
                    old = [old[i] for i in plan.row_map]
                records.append(record("d", lsn, seq, tuple(old), True, None))
                if plan.tombstones:
                    tombstones.after_record(records[-1], records)
                seq += 1
        return RoutedChunk(tx.xid, tx.commit_lsn, tx.end_lsn, records, [], True, [])


def _key_only(plan, row: tuple) -> tuple:
    """A row as the route's plan maps it, with only its key columns (a delete's old key)."""
    if plan.row_map is not None:
        row = tuple(row[i] for i in plan.row_map)
    pick = getattr(plan.encoder, "_key_pick", None)
    if not pick:
        return row
    old = [None] * len(row)
    for i in pick:
        old[i] = row[i]
    return tuple(old)


def _c_layout(encoder: TableEncoder) -> bool:
    """The C encoder writes every column of the layout (no float: ``copy_records``)."""
    cols = encoder.relation.columns
    return encoder._codec is not None and not any(
        cols[i].type_oid in (FLOAT4, FLOAT8) for i in encoder._pick + encoder._key_pick)


def encode_text(parts: list, data: bytes, lsn: int, first_seq: int,
                packed: bool = False) -> list | PackedRecords | None:
    """Every route's records of the COPY text ``data`` by ``router._native.copy_records``
    (pure C without the GIL: call it from a worker thread and two sessions encode at once),
    route after route as ``SnapshotRows.chunk`` orders them (``packed``: as one
    ``RecordBlock`` a route); None when C declines."""
    out: list = []
    for _, (codec, topic, head, mid, tail, lsn_header) in parts:
        records = NATIVE.copy_records(data, codec, topic, head, mid, tail, lsn, first_seq,
                                      lsn_header, _H_SEQ, packed)
        if records is None:
            return None
        if packed:
            out.append(RecordBlock(topic, *records, lsn_header, _H_SEQ, first_seq))
        else:
            out += records
    return PackedRecords(out) if packed else out


def copy_records_py(data: bytes, encoder: TableEncoder, tx: TxContext, topic: str, lsn: int,
                    first_seq: int, lsn_header: tuple | None, seq_name: str) -> list:
    """The reference of ``router._native.copy_records``: the COPY text's rows parsed
    (``copy_rows_py``), each recorded as the Python recorder records a snapshot row."""
    record = PyRecorder(encoder._encode_py, topic, seq_name)
    record.tx, record.lsn_header = tx, lsn_header
    return [record("r", lsn, first_seq + i, None, False, row)
            for i, row in enumerate(copy_rows_py(data))]
