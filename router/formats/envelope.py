"""Kafka records: the Debezium-shaped envelope pgrouter writes for every routed change.

Rules (see README "Message format"):

* key   = JSON object of the key columns the relation flags (``{"id": 7}``): the primary key
  whenever the table has one, else the replica identity (``router.routing.keys``, applied by
  ``ChangeRouter.keyed``); ``null`` when there is none and for truncates/messages.
* value = ``{"op", "before", "after", "source", "ts_ms"}`` (+ ``"unchanged_toast"`` when the new
  row has unchanged-TOAST columns, which are then left out of ``after``). ``op``: ``c`` insert,
  ``u`` update, ``d`` delete, ``t`` truncate, ``r`` snapshot read, ``m`` logical message.
* ``source``: ``db``, ``schema``, ``table``, ``lsn`` (the change's WAL position),
  ``commit_lsn``, ``seq`` (ordinal of the change in its transaction, 0-based), ``xid``,
  ``commit_time`` (ISO-8601 UTC, microseconds), ``origin``/``origin_lsn`` (replication origin
  of the transaction, null when local), ``route``, ``schema_id`` (see ``router.formats.schema``).
  LSNs are JSON integers so consumers can order by ``(commit_lsn, seq)``.
* ``ts_ms`` is the commit time in Unix milliseconds, not the time of sending: a record written
  again after a restart is byte-identical to the first copy.
* Values: integer types and OIDs → JSON numbers, float4/8 → numbers (``"NaN"``,
  ``"Infinity"``, ``"-Infinity"`` stay strings), bool → JSON booleans, everything else
  PostgreSQL's text form (numeric, timestamps, json, arrays, bytea as ``\\x…`` …): lossless.
"""

from __future__ import annotations

import base64
import functools
from typing import Callable

import msgspec

from ..native import NATIVE
from .recorders import PyRecorder
from ..pgoutput import UNCHANGED_TOAST, Relation
from ..pgoutput.timestamps import pg_time_to_iso, pg_time_to_unix_ms
from .schema import TableSchema, table_schema
from .values import BOOL, FLOAT4, FLOAT8, INT2, INT4, INT8, OID

_encode = msgspec.json.Encoder().encode
_NONFINITE = {"NaN", "Infinity", "-Infinity"}
_PLAIN = frozenset({str, type(None)})


def _float(text: str):
    return text if text in _NONFINITE else float(text)


def _bool(text: str) -> bool:
    return text == "t"


_JSON_FROM_TEXT: dict[int, Callable[[str], object]] = {
    INT2: int, INT4: int, INT8: int, OID: int, FLOAT4: _float, FLOAT8: _float, BOOL: _bool,
}
#: the same conversions as kinds of ``router._native.RowCodec`` (0: text as is)
_NATIVE_KIND = {INT2: 1, INT4: 1, INT8: 1, OID: 1, FLOAT4: 2, FLOAT8: 2, BOOL: 3}


def _binary(value: bytes) -> str:
    # binary-mode tuples carry the type's send() form; bytea's is the raw bytes, and its
    # text form is hex, which is what every other consumer of pgrouter sees.
    return "\\x" + value.hex()


def _key_values(key_pick: tuple[int, ...], new: tuple, old: tuple | None) -> tuple:
    """``new`` with unchanged-TOAST key columns taken from the old key tuple."""
    if old is None or all(new[i] is not UNCHANGED_TOAST for i in key_pick):
        return new
    row = list(new)
    for i in key_pick:
        if row[i] is UNCHANGED_TOAST:
            row[i] = old[i]
    return tuple(row)


class TxContext(msgspec.Struct, frozen=True):
    """What every record of one transaction shares."""

    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time: int  # µs since 2000-01-01, as on the wire
    origin: str | None = None
    origin_lsn: int | None = None

    @property
    def commit_time_iso(self) -> str:
        return pg_time_to_iso(self.commit_time)

    @property
    def ts_ms(self) -> int:
        return pg_time_to_unix_ms(self.commit_time)


class TableEncoder:
    """Encodes changes of one relation layout for one route. Built once per Relation message
    (layouts change only with a new Relation), used for every change of that layout.

    The hot path (once per record) never builds the envelope as dicts: per transaction the
    value is filled into the layout's two-level template (``_static_template``) and every record fills in
    ``op``, ``before``, ``after``, ``lsn`` and ``seq`` with one ``%``; plain rows (text values
    and NULLs, all columns) are encoded from a Struct of the layout. Both give exactly the
    bytes of the dict-built envelope (``tests/router/test_envelope.py`` checks that)."""

    __slots__ = ("relation", "route", "db", "schema", "_names", "_conv", "_pick", "_key_pick",
                 "_key_names", "_source_static", "_identity", "_convs", "_key_single",
                 "_tx", "_source_tmpl", "_ts_ms", "_row_struct", "_width", "_value_tmpl",
                 "_static_tmpl", "_codec", "_head", "_mid", "_tail", "_route_part", "_recorder",
                 "_delete_key", "_recorders", "transform")

    def __init__(self, relation: Relation, *, route: str, db: str,
                 column_indexes: tuple[int, ...] | None = None,
                 type_names: dict[int, str] | None = None,
                 delete_key: tuple[int, ...] | None = None, transform=None):
        self.relation = relation
        self.transform = transform  # router.routing.transforms: rows transformed on the Python path
        #: the columns keying a DELETE's key-only old tuple when they are not the key columns
        #: (an identity index without the primary key, ``router.routing.keys``); rare, so such a
        #: layout takes the Python path
        self._delete_key = delete_key
        self.route = route
        self.db = db
        self.schema: TableSchema = table_schema(relation, column_indexes, type_names)
        cols = relation.columns
        pick = tuple(range(len(cols))) if column_indexes is None else tuple(column_indexes)
        self._pick = pick
        self._names = tuple(cols[i].name for i in pick)
        self._conv = tuple(_JSON_FROM_TEXT.get(cols[i].type_oid) for i in pick)
        self._key_pick = tuple(i for i, c in enumerate(cols) if c.flags & 1)
        self._key_names = tuple(cols[i].name for i in self._key_pick)
        self._source_static = {"db": db, "schema": relation.namespace, "table": relation.name}
        self._static_tmpl = _static_template(db, relation.namespace, relation.name, route,
                                             self.schema.schema_id)
        # plain rows (text values and NULLs only, every column) are encoded from a Struct of
        # the layout with the converted columns patched in; a one-column key from a
        # pre-encoded prefix. Both give the same bytes as the general path (``row``).
        self._identity = column_indexes is None
        self._width = len(cols)
        self._convs = tuple((j, c) for j, c in enumerate(self._conv) if c is not None)
        self._row_struct = _row_struct(self._names) if self._identity else None
        self._key_single = None
        if len(self._key_pick) == 1:
            i = self._key_pick[0]
            self._key_single = (i, b"{" + _encode(cols[i].name) + b":",
                                _JSON_FROM_TEXT.get(cols[i].type_oid))
        self._tx: TxContext | None = None
        self._source_tmpl: dict = {}
        self._ts_ms = 0
        self._value_tmpl = b""
        # the C encoder of the same bytes (``router.native``), with the envelope around each
        # record's lsn and seq in three parts: head (per table), mid and tail (per transaction)
        self._codec = None
        self._head = (b',"source":{"db":' + _encode(db) + b',"schema":'
                      + _encode(relation.namespace) + b',"table":' + _encode(relation.name)
                      + b',"lsn":')
        self._route_part = (b',"route":' + _encode(route) + b',"schema_id":'
                            + _encode(self.schema.schema_id))
        self._mid = self._tail = b""
        self._recorder = None
        self._recorders: dict[str, tuple] = {}  # topic -> (recorder, its PyRecorder)
        if NATIVE is not None and delete_key is None and transform is None:
            self._codec = NATIVE.RowCodec(
                len(cols), pick, tuple(_encode(n) + b":" for n in self._names),
                bytes(_NATIVE_KIND.get(cols[i].type_oid, 0) for i in pick),
                self._key_pick, tuple(_encode(n) + b":" for n in self._key_names),
                bytes(_NATIVE_KIND.get(cols[i].type_oid, 0) for i in self._key_pick),
                _encode)

    # -- rows ----------------------------------------------------------------------------------

    def _value(self, conv, value):
        if value is None:
            return None
        if type(value) is bytes:
            return _binary(value)
        return value if conv is None else conv(value)

    def row(self, values: tuple, *, skip_nulls: bool = False) -> tuple[dict, list[str] | None]:
        """Project and convert a tuple. Returns the JSON object and the names of
        unchanged-TOAST columns (left out of the object), or None when there are none."""
        out = {}
        toast = None
        conv = self._conv
        names = self._names
        for j, i in enumerate(self._pick):
            v = values[i]
            if v is None:
                if not skip_nulls:
                    out[names[j]] = None
            elif v is UNCHANGED_TOAST:
                if toast is None:
                    toast = []
                toast.append(names[j])
            elif type(v) is bytes:
                out[names[j]] = _binary(v)
            else:
                c = conv[j]
                out[names[j]] = v if c is None else c(v)
        return out, toast

    def row_json(self, values: tuple, skip_nulls: bool = False) -> tuple[bytes, list | None]:
        """``row`` encoded as JSON: (bytes, unchanged-TOAST column names or None)."""
        struct = self._row_struct
        if (struct is not None and not skip_nulls and len(values) == self._width
                and _PLAIN.issuperset(map(type, values))):
            if self._convs:
                values = list(values)
                for j, c in self._convs:
                    v = values[j]
                    if v is not None:
                        values[j] = c(v)
            return _encode(struct(*values)), None
        out, toast = self.row(values, skip_nulls=skip_nulls)
        return _encode(out), toast

    def key(self, values: tuple | None) -> bytes:
        if not self._key_pick or values is None:
            return b"null"
        single = self._key_single
        if single is not None:
            i, prefix, c = single
            v = values[i]
            if type(v) is str:
                return prefix + _encode(v if c is None else c(v)) + b"}"
        rel = self.relation.columns
        out = {}
        for i in self._key_pick:
            v = values[i]
            c = _JSON_FROM_TEXT.get(rel[i].type_oid)
            out[rel[i].name] = None if v is UNCHANGED_TOAST else self._value(c, v)
        return _encode(out)

    # -- records -------------------------------------------------------------------------------

    def _use_tx(self, tx: TxContext) -> None:
        """What a transaction's records share, computed once per transaction (cheaply: a
        stream of one-row transactions pays this for every record)."""
        self._tx = tx
        self._source_tmpl = None
        if self._codec is None:
            self._python_tx(tx)
            return
        self._value_tmpl = None  # the Python path's template, made when it is needed
        bits = NATIVE.tx_bits(tx.commit_lsn, tx.xid, tx.commit_time, tx.origin, tx.origin_lsn,
                              self._route_part)
        if bits is not None:
            self._mid, self._tail = bits
            return
        commit_lsn, xid, commit_time, origin, origin_lsn, ts_ms = _tx_json(tx)
        self._mid = b',"commit_lsn":' + commit_lsn + b',"seq":'
        self._tail = (b',"xid":' + xid + b',"commit_time":' + commit_time + b',"origin":'
                      + origin + b',"origin_lsn":' + origin_lsn + self._route_part
                      + b'},"ts_ms":' + ts_ms + b'}')

    def _python_tx(self, tx: TxContext) -> None:
        parts = _tx_parts(tx)
        self._ts_ms = parts[-1]
        self._value_tmpl = self._static_tmpl % parts[:-1]

    def _source(self, tx: TxContext, lsn: int, seq: int) -> dict:
        if tx is not self._tx:
            self._use_tx(tx)
        if self._source_tmpl is None:
            src = dict(self._source_static)
            src["lsn"] = 0
            src["commit_lsn"] = tx.commit_lsn
            src["seq"] = 0
            src["xid"] = tx.xid
            src["commit_time"] = tx.commit_time_iso
            src["origin"] = tx.origin
            src["origin_lsn"] = tx.origin_lsn
            src["route"] = self.route
            src["schema_id"] = self.schema.schema_id
            self._source_tmpl = src
        src = self._source_tmpl.copy()  # keys keep their order: lsn and seq are overwritten
        src["lsn"] = lsn
        src["seq"] = seq
        return src

    def encode(self, op: str, tx: TxContext, lsn: int, seq: int, *, old: tuple | None,
               old_is_key: bool, new: tuple | None) -> tuple[bytes, bytes]:
        """(key, value) for a row change. ``op`` is ``c``, ``u``, ``d`` or ``r``."""
        return self.encode_change(op, tx, lsn, seq, old, old_is_key, new)

    def encode_change(self, op: str, tx: TxContext, lsn: int, seq: int, old: tuple | None,
                      old_is_key: bool, new: tuple | None) -> tuple[bytes, bytes]:
        """``encode`` with positional arguments."""
        if tx is not self._tx:
            self._use_tx(tx)
        codec = self._codec
        if codec is not None:
            out = codec.change(_OPS.get(op) or _encode(op), self._head, self._mid, self._tail,
                               lsn, seq, old, old_is_key, new)
            if out is not None:
                return out
        return self._encode_py(op, tx, lsn, seq, old, old_is_key, new)

    def recorder(self, tx: TxContext, topic: str, lsn_header: tuple | None, seq_name: str):
        """The router's hot path: ``record(op, lsn, seq, old, old_is_key, new) -> (topic,
        key, value, headers)`` for the changes of ``tx`` to ``topic``, headers
        ``[lsn_header, (seq_name, b"<seq>")]`` (None without ``lsn_header``); in C
        (``router._native.Recorder``) with ``_encode_py`` for what C leaves to Python.
        One recorder per topic is made and bound to each transaction in turn: a recorder is
        used for ``tx`` until this is asked for another transaction (the router routes one
        transaction at a time)."""
        cached = self._recorder
        if cached is not None and cached[0] is tx and cached[1] == topic:
            return cached[2]
        if tx is not self._tx:
            self._use_tx(tx)
        made = self._recorders.get(topic)
        if made is None or made[1].seq_name != seq_name:
            fallback = PyRecorder(self._encode_py, topic, seq_name)
            record = fallback if self._codec is None else NATIVE.Recorder(
                self._codec, topic, self._head, self._mid, self._tail, fallback, lsn_header,
                seq_name)
            made = self._recorders[topic] = (record, fallback)
        record, fallback = made
        fallback.tx, fallback.lsn_header = tx, lsn_header
        if record is not fallback:
            record.rebind(self._mid, self._tail, lsn_header)
        self._recorder = (tx, topic, record)
        return record

    def _encode_py(self, op: str, tx: TxContext, lsn: int, seq: int, old: tuple | None,
                   old_is_key: bool, new: tuple | None) -> tuple[bytes, bytes]:
        if tx is not self._tx:
            self._use_tx(tx)
        if self._value_tmpl is None:
            self._python_tx(tx)
        if self.transform is not None:
            old, new = self.transform(old), self.transform(new)
        before = after = b"null"
        toast = None
        if old is not None:
            before = self.row_json(old, old_is_key)[0]
        if new is not None:
            after, toast = self.row_json(new)
            # a TOASTed key column that did not change is not in the new tuple; PostgreSQL
            # then logs the old key (it does whenever the identity has external values)
            key = self.key(new if not toast else _key_values(self._key_pick, new, old))
        elif old_is_key and self._delete_key is not None:
            cols = self.relation.columns
            key = _encode({cols[i].name: self._value(_JSON_FROM_TEXT.get(cols[i].type_oid),
                                                     old[i]) for i in self._delete_key})
        else:
            key = self.key(old)
        if toast:
            value = {"op": op, "before": msgspec.Raw(before), "after": msgspec.Raw(after),
                     "source": self._source(tx, lsn, seq), "ts_ms": self._ts_ms,
                     "unchanged_toast": toast}
            return key, _encode(value)
        return key, self._value_tmpl % (_OPS.get(op) or _encode(op), before, after, lsn, seq)

    def encode_truncate(self, tx: TxContext, lsn: int, seq: int, options: int) -> tuple[bytes, bytes]:
        value = {"op": "t", "before": None, "after": None,
                 "source": self._source(tx, lsn, seq), "ts_ms": tx.ts_ms,
                 "truncate": {"cascade": bool(options & 1), "restart_identity": bool(options & 2)}}
        return b"null", _encode(value)


_OPS = {op: _encode(op) for op in ("c", "u", "d", "r")}


def _static_template(db: str, schema: str, table: str, route: str, schema_id: str) -> bytes:
    """The envelope of one table's records as a two-level ``%`` template: the transaction's
    values fill it first (``_tx_parts``), each record's op, before, after, lsn and seq then.
    Literal text is escaped for both rounds. Key order and spacing are exactly msgspec's
    encoding of the envelope dict (a test compares the bytes)."""
    def lit(value) -> bytes:
        return _encode(value).replace(b"%", b"%%%%")
    return (b'{"op":%%b,"before":%%b,"after":%%b,"source":{"db":' + lit(db)
            + b',"schema":' + lit(schema) + b',"table":' + lit(table)
            + b',"lsn":%%d,"commit_lsn":%b,"seq":%%d,"xid":%b,"commit_time":%b'
            + b',"origin":%b,"origin_lsn":%b,"route":' + lit(route)
            + b',"schema_id":' + lit(schema_id) + b'},"ts_ms":%b}')


@functools.lru_cache(maxsize=8)
def _tx_parts(tx: TxContext) -> tuple:
    """A transaction's encoded values for ``_static_template`` (escaped for the second
    round), plus its ``ts_ms``; shared by every table the transaction touches."""
    def lit(value) -> bytes:
        return _encode(value).replace(b"%", b"%%")
    ts_ms = tx.ts_ms
    return (lit(tx.commit_lsn), lit(tx.xid), lit(tx.commit_time_iso), lit(tx.origin),
            lit(tx.origin_lsn), lit(ts_ms), ts_ms)


@functools.lru_cache(maxsize=8)
def _tx_json(tx: TxContext) -> tuple:
    """A transaction's encoded source values for ``router._native.RowCodec``."""
    return (b"%d" % tx.commit_lsn, b"%d" % tx.xid, _encode(tx.commit_time_iso),
            _encode(tx.origin), b"null" if tx.origin_lsn is None else b"%d" % tx.origin_lsn,
            b"%d" % tx.ts_ms)


def _row_struct(names: tuple[str, ...]):
    """A Struct whose JSON encoding is the row object: fields in column order, renamed to
    the column names (any names, also ones that are not Python identifiers)."""
    fields = [f"c{i}" for i in range(len(names))]
    try:
        return msgspec.defstruct("Row", fields, rename=dict(zip(fields, names)), gc=False)
    except (TypeError, ValueError):  # e.g. more fields than msgspec supports: general path
        return None


def encode_message(*, db: str, route: str, tx: TxContext | None, lsn: int, seq: int,
                   transactional: bool, prefix: str, content: bytes) -> tuple[bytes, bytes]:
    """A logical decoding message (``pg_logical_emit_message``) as an ``op: m`` record."""
    source = {"db": db, "schema": None, "table": None, "lsn": lsn,
              "commit_lsn": tx.commit_lsn if tx else None, "seq": seq,
              "xid": tx.xid if tx else None,
              "commit_time": tx.commit_time_iso if tx else None,
              "origin": tx.origin if tx else None, "origin_lsn": tx.origin_lsn if tx else None,
              "route": route, "schema_id": None}
    value = {"op": "m", "before": None, "after": None, "source": source,
             "ts_ms": tx.ts_ms if tx else None,
             "message": {"prefix": prefix, "transactional": transactional,
                         "content": base64.b64encode(content).decode()}}
    return b"null", _encode(value)
