"""PostgreSQL's own sequence of operations per table, from a pgoutput slot peeked through
the SQL interface with a route's publications, next to the sequence a topic holds.

Both sides are reduced to ``(op, key)`` in commit order: ``c``/``u``/``d`` with the key
columns as PostgreSQL prints them (the new key of an update, the old one of a delete), and
``t`` for a truncate. So an UPDATE that a row filter turns into an INSERT or a DELETE, or a
change a filter drops, is compared with what PostgreSQL itself sends to a subscriber."""

from __future__ import annotations

from router.pgoutput import Decoder
from router.pgoutput.messages import (COLUMN_FLAG_KEY, Delete, Insert, Relation, Truncate,
                                      Update)
from router.stream.relations import RelationCache
from router.stream.transactions import Transaction, TransactionAssembler
from tests.helpers import Pg, pg_text


def slot_changes(pg: Pg, slot: str, publications: str):
    """The changes of the committed transactions ``slot`` holds for ``publications`` (comma
    separated), in commit order, as the router assembles them; the slot is consumed."""
    rows = pg.run("select lsn::text, data from pg_logical_slot_get_binary_changes(%s, null, "
                  "null, 'proto_version', '1', 'publication_names', %s)", slot, publications)
    decoder, assembler = Decoder(1), TransactionAssembler(RelationCache())
    for lsn, data in rows:
        hi, lo = lsn.split("/")
        for ev in assembler.feed((int(hi, 16) << 32) | int(lo, 16), decoder.decode(bytes(data))):
            if type(ev) is Transaction:
                yield from ev.changes


def _text(v) -> str | None:
    if v is None:
        return None
    return v.decode() if isinstance(v, (bytes, bytearray, memoryview)) else str(v)


def _key(rel: Relation, values: tuple) -> tuple:
    keys = [i for i, c in enumerate(rel.columns) if c.flags & COLUMN_FLAG_KEY]
    if len(values) == len(rel.columns):
        return tuple(_text(values[i]) for i in keys)
    return tuple(_text(v) for v in values[:len(keys)])


def server_ops(pg: Pg, slot: str, publications: list[str]) -> dict[str, list[tuple]]:
    """table name -> [(op, key)] as pgoutput sends them to a subscriber of ``publications``."""
    rows = pg.run("select data from pg_logical_slot_peek_binary_changes(%s, null, null, "
                  "'proto_version', '1', 'publication_names', %s)", slot, ",".join(publications))
    decoder, rels, out = Decoder(1), {}, {}
    for (data,) in rows:
        msg = decoder.decode(bytes(data))
        kind = type(msg)
        if kind is Relation:
            rels[msg.relation_id] = msg
        elif kind is Insert:
            rel = rels[msg.relation_id]
            out.setdefault(rel.name, []).append(("c", _key(rel, msg.new)))
        elif kind is Update:
            rel = rels[msg.relation_id]
            out.setdefault(rel.name, []).append(("u", _key(rel, msg.new)))
        elif kind is Delete:
            rel = rels[msg.relation_id]
            out.setdefault(rel.name, []).append(("d", _key(rel, msg.key or msg.old)))
        elif kind is Truncate:
            for rid in msg.relation_ids:
                out.setdefault(rels[rid].name, []).append(("t", ()))
    return out


def topic_ops(records: list[dict], key: list[str]) -> list[tuple]:
    """[(op, key)] of a topic's change records in position order."""
    ordered = sorted(records, key=lambda r: (r["value"]["source"]["commit_lsn"],
                                             r["value"]["source"]["seq"]))
    out = []
    for r in ordered:
        v = r["value"]
        if v["op"] == "t":
            out.append(("t", ()))
        else:
            row = v["after"] if v["op"] in ("c", "r", "u") else v["before"]
            out.append(("c" if v["op"] == "r" else v["op"], tuple(pg_text(row[k]) for k in key)))
    return out
