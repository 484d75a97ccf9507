"""Short transactions routed in one step (``ChangeRouter.route_short``).

``ChangeRouter.route`` is a generator built for transactions of any size (chunks of
``chunk_records``, spilled changes read back, definitions messages, filters). A stream of
one-row transactions pays its set-up for every row. ``route_short`` gives the one chunk of a
transaction that needs none of that, with the same records, schemas and counts as
``route``; for any other transaction it returns None before it has changed anything, and
the caller routes it the long way.

The plain case: every change in memory (nothing spilled, no aborted subtransaction) and an
insert, update or delete. Where every plan of the relation publishes the action as it is
(``ChangeRouter._dispatch_for``'s direct targets) its recorders are called here; where
some plan has a row filter, a column list or a row map, ``_route_change`` evaluates it, as
``route`` does.
"""

from __future__ import annotations

from .envelope import TxContext
from .plans import KINDS

_H_LSN, _H_SEQ = "pgrouter.commit_lsn", "pgrouter.seq"


class RoutesShort:
    """``route_short`` for ``ChangeRouter`` (which has the state it reads)."""

    def route_short(self, txn):
        changes = txn.changes.in_memory()
        if changes is None or self._pending_routes is not None:
            return None
        self._check_definitions()
        dispatch = self._dispatch
        # checked whole first: a transaction left to route() must leave no trace here
        for change in changes:
            op = change.op
            if op not in KINDS:
                return None
            rel = change.relation
            entry = dispatch.get(rel.relation_id)
            if entry is None or entry[0] is not rel:
                self._dispatch_for(rel)
        tx = TxContext(txn.xid, txn.commit_lsn, txn.end_lsn, txn.commit_time,
                       txn.origin_name, txn.origin_lsn)
        lsn_header = (_H_LSN, b"%d" % txn.commit_lsn) if self.position_headers else None
        records: list = []
        schemas: list = []
        seen = self._seen_schemas
        seq = 0
        for change in changes:
            op = change.op
            entry = dispatch[change.relation.relation_id]
            targets = entry[4][op]
            if targets is None:  # some plan filters or maps rows: each one evaluated
                self._route_change(change, tx, seq, records, schemas, lsn_header)
                seq += 1
                continue
            kind = KINDS[op]
            for topic, encoder in targets:
                schema = encoder.schema
                if schema.schema_id not in seen:
                    seen.add(schema.schema_id)
                    schemas.append(schema)
                records.append(encoder.recorder(tx, topic, lsn_header, _H_SEQ)(
                    kind, change.lsn, seq, change.old, change.old_is_key, change.new))
            skip = entry[5][op]
            if skip:  # routes taking the table but not this action
                self._count_dropped(skip)
            seq += 1
        return self._chunk(txn, records, schemas, True)
