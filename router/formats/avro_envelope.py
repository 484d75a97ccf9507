"""The fixed parts of ``router.formats.avro``'s records: the ``Envelope`` record's fields around the
row (``io.pgrouter.Source``, ``unchanged_toast``, ``io.pgrouter.Truncate``, ``key_change``),
the schema of logical decoding messages (``io.pgrouter.Message``), and their Avro binary
writers. The rules are ``router.formats.avro``'s; ``router._native``'s ``avro.c`` writes the same
fields in the same order.
"""

from __future__ import annotations

from .avro_types import _long, _optional, _w_string, w_array

_SOURCE_FIELDS = [("db", "string", False), ("schema", "string", True),
                  ("table", "string", True), ("lsn", "long", True),
                  ("commit_lsn", "long", True), ("seq", "long", True), ("xid", "long", True),
                  ("commit_time", "string", True), ("origin", "string", True),
                  ("origin_lsn", "long", True), ("route", "string", True),
                  ("schema_id", "string", True)]
_PLAIN_WRITERS = {"string": _w_string, "long": _long}


def _field(name: str, schema, optional: bool):
    if optional:
        return {"name": name, "type": ["null", schema], "default": None}
    return {"name": name, "type": schema}


def _source_schema() -> dict:
    return {"type": "record", "name": "Source", "namespace": "io.pgrouter",
            "fields": [_field(n, t, o) for n, t, o in _SOURCE_FIELDS]}


def _source_writer():
    writers = [(n, _optional(_PLAIN_WRITERS[t]) if o else _PLAIN_WRITERS[t])
               for n, t, o in _SOURCE_FIELDS]

    def write(out: bytearray, source: dict) -> None:
        for name, w in writers:
            w(out, source.get(name))
    return write


_write_source = _source_writer()
_write_opt_long = _optional(_long)
_TRUNCATE_SCHEMA = {"type": "record", "name": "Truncate", "namespace": "io.pgrouter",
                    "fields": [{"name": "cascade", "type": "boolean"},
                               {"name": "restart_identity", "type": "boolean"}]}


def _w_names(out: bytearray, names: list) -> None:
    w_array(out, names, _w_string)


_write_toast = _optional(_w_names)


def _w_truncate(out: bytearray, t: dict) -> None:
    out.append(1 if t.get("cascade") else 0)
    out.append(1 if t.get("restart_identity") else 0)


_write_truncate = _optional(_w_truncate)
_write_opt_string = _optional(_w_string)


def _envelope_fields(row_schema: dict, namespace: str) -> list:
    # the row record is defined in ``before`` and named in ``after``
    return [_field("before", row_schema, True),
            _field("after", namespace + ".Value", True),
            {"name": "source", "type": _source_schema()},
            {"name": "op", "type": "string"},
            _field("ts_ms", "long", True),
            _field("unchanged_toast", {"type": "array", "items": "string"}, True),
            _field("truncate", _TRUNCATE_SCHEMA, True),
            _field("key_change", "string", True)]


MESSAGE_SCHEMA = {
    "type": "record", "name": "Message", "namespace": "io.pgrouter",
    "fields": [{"name": "op", "type": "string"}, {"name": "source", "type": _source_schema()},
               _field("ts_ms", "long", True),
               {"name": "message", "type": {
                   "type": "record", "name": "Content", "namespace": "io.pgrouter",
                   "fields": [{"name": "prefix", "type": "string"},
                              {"name": "transactional", "type": "boolean"},
                              {"name": "content", "type": "bytes"}]}}]}
