"""The record key: which columns of a relation key its Kafka records.

Rules (the README's "Message format" and "Order"):

* A table with a primary key is keyed by its primary key, whatever its replica identity and
  across every catalog change (a new Relation message, DDL, a restart): records of one row
  keep one key, so they stay on one partition in commit order.

  - DEFAULT: the Relation message flags exactly the primary key.
  - FULL: it flags every column; the old tuple is the whole old row, so a DELETE or an
    UPDATE still carries the primary key's old values.
  - USING INDEX: it flags the index's columns. When they include the primary key the old
    key tuple carries its values. When they do not (``mismatched``), a DELETE carries only
    the index's columns: inserts and updates are still keyed by the primary key (from the
    new row), a DELETE by the identity index's columns — the only values it has.
  - NOTHING: nothing is flagged; UPDATEs carry the new row (keyed by the primary key) and
    PostgreSQL refuses UPDATE/DELETE when the publication publishes them.

* A table without a primary key is keyed by its replica identity: the identity index's
  columns (USING INDEX), every column (FULL: the key is the whole row, so an UPDATE moves
  the row to another key; give such tables a primary key), no key (``null``) otherwise.

The primary keys come from the catalog (read when the router starts, for every table, and
looked up when a relation appears the router does not know) and from Relation messages:
with REPLICA IDENTITY DEFAULT the flagged columns *are* the primary key, so a table whose
first Relation says DEFAULT needs no catalog at all.
"""

from __future__ import annotations

import msgspec

from ..pgoutput import Relation

TableName = tuple[str, str]
#: the Relation column flag marking a replica-identity (key) column
KEY_FLAG = 1


class PrimaryKeys:
    """Primary key column names per table (an empty tuple: known to have none)."""

    __slots__ = ("_known",)

    def __init__(self, known: dict[TableName, tuple[str, ...]] | None = None):
        self._known: dict[TableName, tuple[str, ...]] = dict(known or {})

    def set(self, table: TableName, columns: tuple[str, ...]) -> None:
        self._known[table] = tuple(columns)

    def get(self, table: TableName) -> tuple[str, ...] | None:
        return self._known.get(table)

    def unknown(self, relation: Relation) -> bool:
        """True when the key of ``relation`` depends on a primary key not known here (a
        catalog lookup is due before its changes are routed)."""
        if relation.replica_identity == "d":
            return False
        pk = self._known.get((relation.namespace, relation.name))
        return pk is None or not set(pk) <= {c.name for c in relation.columns}

    def keyed(self, relation: Relation) -> Relation:
        """``relation`` with exactly its record-key columns flagged (the same struct when
        they already are)."""
        table = (relation.namespace, relation.name)
        ident = relation.replica_identity
        flagged = tuple(c.name for c in relation.columns if c.flags & KEY_FLAG)
        if ident == "d":
            if relation.relation_id:  # a real Relation message, not an ancestor's view
                self._known[table] = flagged  # DEFAULT flags exactly the primary key
            return relation
        pk = self._known.get(table)
        if not pk or not set(pk) <= {c.name for c in relation.columns}:
            return relation
        if set(pk) == set(flagged):
            return relation
        cols = tuple(msgspec.structs.replace(
            c, flags=(c.flags | KEY_FLAG) if c.name in pk else (c.flags & ~KEY_FLAG))
            for c in relation.columns)
        return msgspec.structs.replace(relation, columns=cols)

    def mismatched(self, relation: Relation) -> tuple[str, ...] | None:
        """The primary key of a USING INDEX relation whose identity index does not include
        it (its DELETEs are keyed by the index), else None."""
        if relation.replica_identity != "i":
            return None
        pk = self._known.get((relation.namespace, relation.name))
        flagged = {c.name for c in relation.columns if c.flags & KEY_FLAG}
        if pk and not set(pk) <= flagged:
            return pk
        return None
