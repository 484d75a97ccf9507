"""Snapshot rows to Kafka records, route by route (``op: "r"``).

Rules:

* The plans are the router's (``ChangeRouter.plans_for`` over route specs that describe the
  initial copy, ``actors.snapshot.tables``): a row is published to a route when the route's
  insert filter passes it (NULL counts as false), mapped to the ancestor's columns when the
  route publishes via the root, projected to the route's column list by its encoder.
* Positions come from the caller (``router.snapshot``): ``first_seq`` is the row ordinal's
  base, the n-th row of a batch gets ``first_seq + n`` on every route.
* Each batch becomes one ``RoutedChunk`` (a "transaction" of its own that confirms
  ``end_lsn``), listing the schemas and topics not used before by this encoder.
"""

from __future__ import annotations

from .changes import Change
from .envelope import TxContext
from .plans import apply_plan
from .pgoutput import Relation
from .routing import ChangeRouter, RoutedChunk

_H_LSN, _H_SEQ = "pgrouter.commit_lsn", "pgrouter.seq"


class SnapshotRows:
    def __init__(self, router: ChangeRouter, *, position_headers: bool = False):
        self.router = router
        self.position_headers = position_headers
        self._schemas: set[str] = set()
        self._topics: set[str] = set()

    def routed(self, relation: Relation) -> bool:
        """Some route takes rows of ``relation``."""
        return bool(self.router.plans_for(relation))

    def chunk(self, relation: Relation, rows: list[tuple], tx: TxContext, first_seq: int,
              *, last: bool = True) -> RoutedChunk:
        """The records of ``rows`` for every route taking ``relation``."""
        plans = self.router.plans_for(relation)
        records: list = []
        schemas = []
        new_topics = []
        lsn_header = (_H_LSN, b"%d" % tx.commit_lsn) if self.position_headers else None
        lsn = tx.end_lsn
        for plan in plans:
            sid = plan.encoder.schema.schema_id
            if sid not in self._schemas:
                self._schemas.add(sid)
                schemas.append(plan.encoder.schema)
            if plan.topic not in self._topics:
                self._topics.add(plan.topic)
                new_topics.append((plan.topic, plan.route))
            record = plan.encoder.recorder(tx, plan.topic, lsn_header, _H_SEQ)
            direct = plan.insert_filter is None and plan.row_map is None
            seq = first_seq
            for row in rows:
                if direct:
                    records.append(record("r", lsn, seq, None, False, row))
                else:
                    r = apply_plan(plan, Change("insert", lsn, relation, None, False, row))
                    if r is not None:
                        records.append(record("r", lsn, seq, None, False, r[3]))
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
                seq += 1
        return RoutedChunk(tx.xid, tx.commit_lsn, tx.end_lsn, records, [], True, [])
