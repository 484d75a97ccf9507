"""From committed transactions to Kafka records, route by route.

Rules:

* A route takes a table when its selector matches (``tables``, ``schemas`` or
  ``all_tables``); what it does with the table's changes is a ``TablePlan``: which actions
  it publishes, an optional row filter per action, an optional column list, the topic and
  the encoder. Plans are built once per Relation layout and cached by relation id (a new
  Relation message means a new plan).
* What a plan does with one change — PostgreSQL's publication semantics — is in
  ``router.routing.plans``.
* Topics are the route's template filled with escaped identifiers (``router.routing.topics``).
* Positions: ``seq`` is the change's ordinal in its transaction, counted before routing, so
  the same change carries the same position on every route and every rerun.
* Output comes in ``RoutedChunk``s of at most ``CHUNK_RECORDS`` records so a huge
  transaction never sits in memory twice. A chunk lists the table schemas not seen before
  this router started; the sink makes them durable before the chunk's records.
* Two ways through, one outcome: ``route`` takes a transaction of any size (chunks, spilled
  changes read back, definitions and TRUNCATE marker messages, filters); ``route_short``
  gives the one chunk of a transaction that needs none of that — every change in memory and
  an insert, update or delete — with the same records, schemas and counts, and returns None
  before it has changed anything for any other transaction (the caller then uses ``route``).
  How a relation's changes go through (recorded directly, or evaluated by each plan) is
  ``router.routing.dispatch``.
* Parts with narrow faces: ``TruncateRoutes`` (``router.routing.truncates``: Truncate changes,
  the statement trigger's markers), ``LogicalMessages`` (``router.routing.messages``) and, after
  ``follow``, a ``DefinitionsFollower`` (``router.routing.following``: routes taken from
  publication definitions at their WAL positions).
"""

from __future__ import annotations

from typing import Iterator

from ..stream.changes import Change
from .definitions import TRUNCATE_PREFIX
from .following import DEFINITIONS_ROUTE, DefinitionsFollower, is_definitions_message
from ..formats.envelope import TxContext
from .dispatch import build_plans, decide, dispatch_entry, record_run
from .keys import PrimaryKeys
from .plans import KINDS, TablePlan
from ..pgoutput import Relation
from .routes import Record, RoutedChunk, RouteSpec  # noqa: F401 — their home was here
from ..formats.schema import TableSchema
from ..formats import tombstones
from .outbox import Poison
from .messages import LogicalMessages
from .topics import TopicFolds
from .truncates import TruncateRoutes
from ..stream.transactions import NonTransactionalMessage, Transaction

CHUNK_RECORDS = 2000

_H_LSN, _H_SEQ = "pgrouter.commit_lsn", "pgrouter.seq"


def _no_headers(commit_lsn: int, seq: int) -> None:
    return None


def _position(commit_lsn: int, seq: int) -> list[tuple[str, bytes]]:
    return [(_H_LSN, b"%d" % commit_lsn), (_H_SEQ, b"%d" % seq)]


class ChangeRouter:
    def __init__(self, routes: list[RouteSpec], *, db: str, messages_topic: str = "",
                 type_names: dict[int, str] | None = None, chunk_records: int = CHUNK_RECORDS,
                 primary_keys: PrimaryKeys | dict[tuple[str, str], tuple[str, ...]] | None = None,
                 position_headers: bool = False, message_routes: list | tuple = (),
                 signal_prefix: str = "", topic_folds: TopicFolds | None = None):
        self.routes = routes
        #: the topics Kafka holds, by fold: an outbox topic colliding with one is a dead row
        self.topic_folds = topic_folds if topic_folds is not None else TopicFolds()
        #: Kafka headers pgrouter.commit_lsn and pgrouter.seq on every change record (the
        #: same position as the value's source; they cost the client ~1 µs a record)
        self._headers = _position if position_headers else _no_headers
        self.position_headers = position_headers
        self.db = db
        #: the tables' primary keys, which key their records (shared by a pipeline's routers)
        self.primary_keys = (primary_keys if isinstance(primary_keys, PrimaryKeys)
                             else PrimaryKeys(primary_keys))
        self.messages_topic = messages_topic
        #: logical messages: the messages topic, message routes, signals of ``signal_prefix``
        #: until the caller takes them (``take_signals``; ``router.routing.messages``)
        self._logical = LogicalMessages(db=db, topic=messages_topic,
                                        message_routes=message_routes,
                                        signal_prefix=signal_prefix, headers=self._headers,
                                        new_topic=self._new_topic)
        self.signals = self._logical.signals  # (commit_lsn, seq, content), until taken
        self.type_names = type_names if type_names is not None else {}
        self.chunk_records = chunk_records
        self._plans: dict[int, tuple[Relation, tuple[TablePlan, ...]]] = {}
        self._seen_schemas: set[str] = set()
        self._seen_topics: set[str] = set()
        self._new_topics: list[tuple[str, str]] = []
        self._pending_routes: list[RouteSpec] | None = None
        self._dispatch: dict[int, tuple] = {}
        #: changes of a relation a route takes that its filter or publish actions dropped,
        #: by route name (read and reset by ``take_dropped``; for the metrics)
        self.dropped: dict[str, int] = {}
        #: (transaction, {id(plan): (plan, recorder)}) for the plans _route_change used in it
        self._plan_recorders: tuple = (None, {})
        self._truncates = TruncateRoutes(self)
        #: set by ``follow``: the routes come from publication definitions in the WAL
        self._follower: DefinitionsFollower | None = None
        #: set when plans changed while routing a transaction (``route`` drops its bound plans)
        self._routes_changed = False

    # -- plans ---------------------------------------------------------------------------------

    def keyed(self, relation: Relation) -> Relation:
        """``relation`` with its record-key columns flagged: the primary key whenever the
        table has one, whatever its replica identity (``router.routing.keys``)."""
        return self.primary_keys.keyed(relation)

    def plans_for(self, relation: Relation) -> tuple[TablePlan, ...]:
        """The plans of the routes taking ``relation`` (``router.routing.dispatch``), cached
        per relation layout."""
        cached = self._plans.get(relation.relation_id)
        if cached is not None and cached[0] is relation:
            return cached[1]
        result = build_plans(self.routes, relation, primary_keys=self.primary_keys, db=self.db,
                             type_names=self.type_names, new_topic=self._new_topic,
                             folds=self.topic_folds)
        self._plans[relation.relation_id] = (relation, result)
        return result

    def forget_plans(self) -> None:
        """Drop cached plans (route definitions changed, e.g. after SIGHUP)."""
        self._plans.clear()
        self._dispatch.clear()

    # -- definitions in the WAL ----------------------------------------------------------------

    def follow(self, definitions, names: frozenset | None = None) -> None:
        """Take the routes from ``definitions`` (``router.routing.definitions.Definitions``, shared
        by a pipeline's routers) from now on, following its messages in the stream."""
        self._follower = DefinitionsFollower(definitions, names)
        self._adopt_definitions()

    def _adopt_definitions(self) -> None:
        self.routes = self._follower.take_routes()
        self._pending_routes = None
        self.forget_plans()
        self._plan_recorders = (None, {})
        self._routes_changed = True

    def _check_definitions(self) -> None:
        follower = self._follower
        if follower is not None and follower.stale():
            self._adopt_definitions()

    def _definitions_message(self, change: Change, tx: TxContext, out: list) -> bool:
        """True when ``change`` (a message) is a definitions message, applied if followed."""
        if not is_definitions_message(change):
            return False
        follower = self._follower
        if follower is not None:
            out.append(follower.apply(change, tx))
            if follower.topic not in self._seen_topics:
                self._seen_topics.add(follower.topic)
                self._new_topics.append((follower.topic, DEFINITIONS_ROUTE))
            self._adopt_definitions()
        return True

    # -- one step: short transactions ----------------------------------------------------------

    def route_short(self, txn):
        changes = txn.changes.in_memory()
        if changes is None or self._pending_routes is not None or txn.first_seq or txn.partial:
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
                if schema is not None and schema.schema_id not in seen:
                    seen.add(schema.schema_id)
                    schemas.append(schema)
                records.append(encoder.recorder(tx, topic, lsn_header, _H_SEQ)(
                    kind, change.lsn, seq, change.old, change.old_is_key, change.new))
            skip = entry[5][op]
            if skip:  # routes taking the table but not this action
                self._count_dropped(skip)
            seq += 1
        return self._chunk(txn, records, schemas, True)

    def _dispatch_for(self, relation: Relation) -> tuple:
        """The dispatch entry of ``relation`` (``router.routing.dispatch.dispatch_entry``)."""
        entry = dispatch_entry(relation, self.plans_for(relation), self._new_topic,
                               self._seen_topics)
        self._dispatch[relation.relation_id] = entry
        return entry

    # -- routing -------------------------------------------------------------------------------

    def replace_routes(self, routes: list[RouteSpec]) -> None:
        """New route definitions (e.g. publications re-read on SIGHUP), used from the next
        transaction on; a transaction already being routed finishes with the old ones."""
        self._pending_routes = routes

    def route(self, txn: Transaction) -> Iterator[RoutedChunk]:
        # a part (``Transaction.partial``): no chunk last, seq from first_seq, routes kept
        if self._pending_routes is not None and not txn.first_seq:
            self.routes, self._pending_routes = self._pending_routes, None
            self.forget_plans()
        self._check_definitions()
        tx = TxContext(xid=txn.xid, commit_lsn=txn.commit_lsn, end_lsn=txn.end_lsn,
                       commit_time=txn.commit_time, origin=txn.origin_name,
                       origin_lsn=txn.origin_lsn)
        records: list = []
        schemas: list[TableSchema] = []
        limit = self.chunk_records
        seq = txn.first_seq
        # one tuple for the whole transaction
        lsn_header = (_H_LSN, b"%d" % txn.commit_lsn) if self._headers is _position else None
        # hot path: changes every plan publishes as they are (see _dispatch_for), each
        # target a recorder bound to this transaction (TableEncoder.recorder)
        bound: dict[int, tuple] = {}  # relation id -> (relation, {op: recorders | None})
        rel = ops = None
        truncates = self._truncates
        changes = txn.changes
        for batch in (changes.runs() if hasattr(changes, "runs") else [list(changes)]):
            i, n = 0, len(batch)
            while i < n:
                change = batch[i]
                op = change.op
                if op in KINDS:
                    if change.relation is not rel:
                        if truncates.marks:
                            truncates.flush(tx, records, schemas)
                        rel = change.relation
                        ops = bound.get(rel.relation_id)
                        if ops is None or ops[0] is not rel:
                            ops = bound[rel.relation_id] = (rel, {})
                        ops = ops[1]
                    recorders = ops.get(op, False)
                    if recorders is False:
                        recorders = ops[op] = self._recorders(rel, op, tx, lsn_header, schemas)
                    if recorders is not None:
                        # this change and the run of changes after it that is recorded the
                        # same way (same relation, bound ops)
                        start = i
                        i, seq = record_run(batch, i, rel, ops, KINDS, seq, records, limit)
                        skips = self._dispatch[rel.relation_id][5]
                        if skips["insert"] or skips["update"] or skips["delete"]:
                            # routes taking the table but not some action (a run may hold
                            # several actions)
                            for c in batch[start:i]:
                                if skips[c.op]:
                                    self._count_dropped(skips[c.op])
                        if len(records) >= limit:
                            yield self._chunk(txn, records, schemas, False)
                            records, schemas = [], []
                        continue
                self._route_change(change, tx, seq, records, schemas, lsn_header)
                if self._routes_changed:  # a definitions message: plans bound so far are old
                    bound, rel, ops, self._routes_changed = {}, None, None, False
                elif truncates.marks:  # the next row change sends them first
                    rel = None
                seq += 1
                i += 1
                if len(records) >= limit:
                    yield self._chunk(txn, records, schemas, False)
                    records, schemas = [], []
        if truncates.marks:
            truncates.flush(tx, records, schemas)
        yield self._chunk(txn, records, schemas, not txn.partial)

    def _recorders(self, rel: Relation, op: str, tx: TxContext, lsn_header: tuple,
                   schemas: list) -> tuple | None:
        """The recorders of ``op`` changes of ``rel`` in ``tx``: one per plan publishing them
        as they are, or None when some plan must evaluate each change (``_route_change``).
        Schemas not published yet join the current chunk."""
        entry = self._dispatch.get(rel.relation_id)
        if entry is None or entry[0] is not rel:
            entry = self._dispatch_for(rel)
        targets = entry[4][op]
        if targets is None:
            return None
        for _, encoder in targets:
            if encoder.schema is not None and encoder.schema.schema_id not in self._seen_schemas:
                self._seen_schemas.add(encoder.schema.schema_id)
                schemas.append(encoder.schema)
        return tuple(encoder.recorder(tx, topic, lsn_header, _H_SEQ) for topic, encoder in targets)

    def _count_dropped(self, routes, n: int = 1) -> None:
        dropped = self.dropped
        for route in routes:
            dropped[route] = dropped.get(route, 0) + n

    def take_dropped(self) -> dict[str, int]:
        dropped, self.dropped = self.dropped, {}
        return dropped

    def _chunk(self, txn: Transaction, records: list, schemas: list, last: bool) -> RoutedChunk:
        return RoutedChunk(txn.xid, txn.commit_lsn, txn.end_lsn, records, schemas, last,
                           self._take_new_topics())

    def route_message(self, msg: NonTransactionalMessage) -> RoutedChunk:
        """A non-transactional logical message: a chunk of its own that confirms nothing
        (``end_lsn`` 0)."""
        records: list = []
        self._logical.non_transactional(msg.message, msg.lsn, records)
        return RoutedChunk(0, msg.lsn, 0, records, [], True, self._take_new_topics())

    def _new_topic(self, topic: str, route: str) -> None:
        if topic not in self._seen_topics:
            self._seen_topics.add(topic)
            self._new_topics.append((topic, route))

    def _take_new_topics(self) -> list:
        new_topics = self._new_topics
        if new_topics:
            self._new_topics = []
        return new_topics

    def take_signals(self) -> list:
        return self._logical.take_signals()

    def _schema(self, plan: TablePlan, schemas: list) -> None:
        sid = plan.encoder.schema.schema_id
        if sid not in self._seen_schemas:
            self._seen_schemas.add(sid)
            schemas.append(plan.encoder.schema)

    def emit_truncate(self, plan: TablePlan, lsn: int, options: int, tx: TxContext, seq: int,
                      out: list, schemas: list) -> None:
        """One TRUNCATE record of ``plan`` (for ``TruncateRoutes``)."""
        self._schema(plan, schemas)
        key, value = plan.encoder.encode_truncate(tx, lsn, seq, options)
        out.append((plan.topic, key, value, self._headers(tx.commit_lsn, seq)))

    def _outbox_event(self, plan: TablePlan, row: tuple, tx: TxContext, seq: int, lsn: int,
                      out: list) -> None:
        position = self._headers(tx.commit_lsn, seq)
        try:
            record = plan.outbox.record(row, position)
        except Poison as why:  # the dead-letter topic's, or a ConfigError
            record = plan.outbox.dead(row, why, lsn, position)
        out.append(record)
        self._new_topic(record[0], plan.route)

    def _route_change(self, change: Change, tx: TxContext, seq: int, out: list,
                      schemas: list, lsn_header: tuple | None) -> None:
        """One change some plan evaluates, or a message or a truncate, routed into ``out``."""
        op = change.op
        if op == "message":
            self._route_message(change, tx, seq, out)
            return
        if op == "truncate":
            self._truncates.route(change, tx, seq, out, schemas)
            return
        rel = change.relation
        entry = self._dispatch.get(rel.relation_id)
        if entry is None or entry[0] is not rel:
            entry = self._dispatch_for(rel)
        results = decide(entry, change, self._count_dropped)
        if results:
            self._record_results(results, change.lsn, tx, seq, out, schemas, lsn_header)

    def _route_message(self, change: Change, tx: TxContext, seq: int, out: list) -> None:
        """A transactional logical message: a TRUNCATE marker, a definitions message, or
        ``router.routing.messages``'."""
        if change.message.prefix == TRUNCATE_PREFIX:
            self._truncates.mark(change, seq)
        elif not self._definitions_message(change, tx, out):
            self._logical.transactional(change, tx, seq, out)

    def _record_results(self, results: list, lsn: int, tx: TxContext, seq: int, out: list,
                        schemas: list, lsn_header: tuple | None) -> None:
        """The records of ``decide``'s results, each plan's recorder bound to ``tx`` once."""
        bound = self._plan_recorders
        if bound[0] is not tx:
            bound = self._plan_recorders = (tx, {})
        for plan, kind, old, old_is_key, new in results:
            if plan.outbox is not None:  # only inserts are events
                if kind == "c":
                    self._outbox_event(plan, new, tx, seq, lsn, out)
                continue
            hit = bound[1].get(id(plan))
            if hit is None:  # the plan's first record in this transaction
                encoder = plan.encoder
                if encoder.schema.schema_id not in self._seen_schemas:
                    self._seen_schemas.add(encoder.schema.schema_id)
                    schemas.append(encoder.schema)
                # the plan is kept with its recorder: its id cannot be reused meanwhile
                hit = bound[1][id(plan)] = (plan, encoder.recorder(tx, plan.topic,
                                                                   lsn_header, _H_SEQ))
            record = hit[1](kind, lsn, seq, old, old_is_key, new)
            out.append(record)
            if plan.tombstones:
                if kind == "d":
                    tombstones.after_record(record, out)
                elif kind == "u":
                    tombstones.after_update(plan.encoder, record, old, old_is_key, out)
