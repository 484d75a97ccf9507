"""TRUNCATE, as pgoutput_truncate sends it, route by route: the part of a ``ChangeRouter``
that routes Truncate changes and holds the statement trigger's markers (``TruncateRoutes``).

Rules:

* Each relation of a Truncate message is sent for the routes that publish it as itself with
  the TRUNCATE action; a partition a route publishes as an ancestor is not (pgoutput skips
  a partition whose ``publish_as_relid`` is not itself).
* A partitioned table is sent when the statement truncated that table itself (named it, or
  an ancestor of it) and a route publishes it as itself (via its root) with TRUNCATE by its
  own publications; a TRUNCATE of partitions alone sends none. A slot whose publications
  send partitions never names the partitioned table, so the statement trigger of
  ``pgrouter setup`` marks it: a transactional message (prefix ``TRUNCATE_PREFIX``, content
  ``["schema", "name"]``) per partitioned table truncated, just before the Truncate. The
  marked tables are sent with the Truncate that follows (its position and options), or, when
  the slot sends none for the statement, at the marker before the next change.
* A table sent twice for one statement (named by the stream and marked) is one record.
* Without the trigger no table is marked: a partitioned table published via its root gets
  no TRUNCATE record (``pgrouter check`` and the start warn).
* The part uses the router's public face only: ``routes``, ``plans_for`` and
  ``emit_truncate`` (which encodes, announces the schema and adds the position headers).
"""

from __future__ import annotations

import msgspec

from ..stream.changes import Change
from ..formats.envelope import TxContext
from ..errors import ProtocolViolation

_decode_mark = msgspec.json.Decoder(tuple[str, str]).decode


class TruncateRoutes:
    __slots__ = ("router", "marks")

    def __init__(self, router):
        self.router = router
        #: (lsn, seq, table) of the markers not acted on yet in this transaction
        self.marks: list = []

    def route(self, change: Change, tx: TxContext, seq: int, out: list, schemas: list) -> None:
        """A Truncate change: a record per route publishing a truncated table as itself."""
        # pgoutput_truncate: each relation of the statement is sent for the publications that
        # publish it as itself, never a partition published as an ancestor. A partitioned
        # table is in the stream only when the slot's publications send it via its root;
        # otherwise the marker messages name the partitioned tables the statement truncated
        # (a TRUNCATE of partitions alone names none), and those published as themselves
        # are sent here, with the statement's position and options.
        marks, self.marks = self.marks, []
        done: set = set()
        emit = self.router.emit_truncate
        for rel in change.relations or ():
            for plan in self.router.plans_for(rel):
                if plan.publish_truncate and not plan.via_ancestor:
                    done.add((plan.topic, plan.route))
                    emit(plan, change.lsn, change.options, tx, seq, out, schemas)
        for _, _, table in marks:
            self._marked(table, change.lsn, seq, change.options, tx, out, schemas, done)

    def mark(self, change: Change, seq: int) -> None:
        """A marker message of the statement trigger: remembered until its Truncate."""
        try:
            schema, name = _decode_mark(change.message.content)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise ProtocolViolation(f"TRUNCATE marker message at {change.lsn:X} does not "
                                    f"name a table: {bytes(change.message.content)[:80]!r}") \
                from None
        self.marks.append((change.lsn, seq, (schema, name)))

    def flush(self, tx: TxContext, out: list, schemas: list) -> None:
        """Marked tables whose statement sent no Truncate this slot reads (no partition of
        theirs is in the slot's publications with TRUNCATE, or they have none): sent at the
        marker's position, before the next change."""
        marks, self.marks = self.marks, []
        done: set = set()
        for lsn, seq, table in marks:
            self._marked(table, lsn, seq, 0, tx, out, schemas, done)

    def _marked(self, table: tuple[str, str], lsn: int, seq: int, options: int,
                tx: TxContext, out: list, schemas: list, done: set) -> None:
        view = None
        planned = set()
        for spec in self.router.routes:
            if spec.planner is not None:
                planned.add(spec.name)
                if view is None:
                    view = spec.planner.relation_of(table)
        if view is None:
            return
        for plan in self.router.plans_for(view):
            if (plan.route in planned and plan.publish_truncate and not plan.via_ancestor
                    and (plan.topic, plan.route) not in done):
                done.add((plan.topic, plan.route))
                self.router.emit_truncate(plan, lsn, options, tx, seq, out, schemas)
