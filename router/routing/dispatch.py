"""Per relation layout: the route plans that take the table and the dispatch entry that says,
per action, whether every plan publishes it as it is (recorded directly) or some plan must
evaluate each change (row filter, column mapping, tombstones). Used by
``router.routing.change_router.ChangeRouter``, which caches both by relation id.

* ``build_plans``: one ``TablePlan`` per route taking the relation (selector or planner),
  keyed by the primary key (``router.routing.keys``), transformed (``router.routing.transforms``),
  or an outbox plan (``router.routing.outbox``).
* ``dispatch_entry``: (relation, plans, columns, decisions, direct, skipping).
* ``decide``: what the plans of an entry publish of one change that some plan evaluates,
  remembering decisions by the filtered columns' values where it can.
* ``record_run``: a run of changes every plan publishes as they are (C, or its Python twin).

Where every plan of a relation publishes an action as it is, both ways through a transaction
(``ChangeRouter.route`` and ``route_short``) call the plans' recorders directly (the entry's
direct targets; ``record_run`` in C); where some plan has a row filter, a column list or a row
map, ``ChangeRouter._route_change`` evaluates it (``decide``).
"""

from __future__ import annotations

from typing import Callable

from ..formats.envelope import TableEncoder
from ..native import NATIVE
from ..pgoutput import Relation
from .keys import PrimaryKeys
from .outbox import OutboxEncoder, OutboxPlan
from .plans import KINDS, TablePlan, apply_plan, materialize
from .routes import RouteSpec
from .topics import TopicFolds
from .transforms import for_relation

#: routing decisions remembered per relation layout, keyed by the filtered columns' values
DECISIONS_MAX = 4096
#: beyond this many filtered columns per relation decisions are not remembered
DECISION_COLUMNS_MAX = 6


def _record_run_py(changes: list, i: int, rel: Relation, ops: dict, kinds: dict, seq: int,
                   records: list, limit: int) -> tuple[int, int]:
    """``router._native.record_run`` in Python: from ``changes[i]`` on, while the change is
    of ``rel`` and ``ops`` has recorders for its op, every recorder's record of it goes to
    ``records``; stops after the change that fills ``records`` to ``limit``. Returns the
    index of the first change not taken and the next seq."""
    n = len(changes)
    while i < n:
        change = changes[i]
        if change.relation is not rel:
            break
        op = change.op
        recorders = ops.get(op)
        if recorders is None:
            break
        kind = kinds[op]
        old, new, lsn, old_is_key = change.old, change.new, change.lsn, change.old_is_key
        for record in recorders:
            records.append(record(kind, lsn, seq, old, old_is_key, new))
        seq += 1
        i += 1
        if len(records) >= limit:
            break
    return i, seq


record_run = NATIVE.record_run if NATIVE is not None else _record_run_py


def build_plans(routes: list[RouteSpec], relation: Relation, *, primary_keys: PrimaryKeys,
                db: str, type_names: dict[int, str],
                new_topic: Callable[[str, str], None],
                folds: TopicFolds | None = None) -> tuple[TablePlan, ...]:
    """The plans of the routes taking ``relation``; ``new_topic(topic, route)`` hears of each
    plan's topic (the router announces those it has not seen); ``folds``: the topics outbox
    events must not collide with."""
    plans = []
    for spec in routes:
        if spec.planner is not None:
            extra = spec.planner(relation)
            if extra is None:
                continue
        elif spec.takes(relation.namespace, relation.name):
            extra = {}
        else:
            continue
        ops = spec.operations
        kwargs = dict(publish_insert="insert" in ops, publish_update="update" in ops,
                      publish_delete="delete" in ops, publish_truncate="truncate" in ops,
                      tombstones=spec.tombstones)
        kwargs.update(extra)
        columns = kwargs.pop("columns", None)
        source = kwargs.pop("publish_as", None) or relation
        publish_as = primary_keys.keyed(source)
        delete_key = None  # an identity index without the primary key keys DELETEs
        if publish_as is not source and primary_keys.mismatched(source):
            delete_key = tuple(i for i, c in enumerate(source.columns) if c.flags & 1)
        published, transform = publish_as, None
        if spec.transforms:  # what leaves is transformed, retyped (router.routing.transforms)
            published, transform = for_relation(spec.transforms, publish_as, route=spec.name,
                                                transform_keys=spec.transform_keys)
        encoder = TableEncoder(published, route=spec.name, db=db, column_indexes=columns,
                               type_names=type_names, delete_key=delete_key,
                               transform=transform)
        if spec.outbox is not None:  # events: topics from the rows (router.routing.outbox)
            plans.append(TablePlan(route=spec.name, topic="", encoder=encoder,
                                   outbox=OutboxPlan(spec.outbox, publish_as, spec.name, folds),
                                   **kwargs))
            continue
        topic = kwargs.pop("topic", None) or spec.topic_for(publish_as.namespace, publish_as.name)
        if folds is not None:  # no outbox event goes to a table route's topic
            folds.reserved.setdefault(topic, f"route {spec.name!r}'s topic of table "
                                             f"{publish_as.namespace}.{publish_as.name}")
        new_topic(topic, spec.name)
        plans.append(TablePlan(route=spec.name, topic=topic, encoder=encoder, **kwargs))
    return tuple(plans)


def dispatch_entry(relation: Relation, plans: tuple[TablePlan, ...],
                   new_topic: Callable[[str, str], None], seen_topics: set) -> tuple:
    """(relation, plans, columns, decisions, direct, skipping): ``columns`` are the
    source-row indexes any plan's filter reads (None when unknown or too many to key on);
    ``decisions`` is ``decide``'s memory; ``direct`` maps an operation to the plans that
    publish it as it is — no filter, no row mapping — as ``(topic, encoder)``, or to None
    when some plan has to evaluate the change (then every plan goes through ``apply_plan``);
    ``skipping`` maps an operation to the routes taking the table but not the action."""
    cols: set | None = set()
    for plan in plans:
        if plan.insert_filter or plan.update_filter or plan.delete_filter:
            if plan.filter_columns is None:
                cols = None
                break
            cols.update(plan.filter_columns)
    if cols is not None and len(cols) > DECISION_COLUMNS_MAX:
        cols = None
    direct: dict[str, tuple | None] = {}
    skipping: dict[str, tuple[str, ...]] = {}
    for op, publish, filt in (("insert", "publish_insert", "insert_filter"),
                              ("update", "publish_update", "update_filter"),
                              ("delete", "publish_delete", "delete_filter")):
        taking = [p for p in plans if getattr(p, publish)]
        skipping[op] = tuple(p.route for p in plans if not getattr(p, publish))
        if any(getattr(p, filt) is not None or p.row_map is not None
               or (p.tombstones and op != "insert") for p in taking):
            direct[op] = None  # (a tombstone follows a delete or a key change)
        else:  # an outbox route's inserts are its events, the rest nothing (router.routing.outbox)
            direct[op] = tuple(
                (p.topic, p.encoder) if p.outbox is None else
                (p.topic, OutboxEncoder(p.outbox, new_topic, seen_topics))
                for p in taking if p.outbox is None or op == "insert")
    return (relation, plans, None if cols is None else tuple(sorted(cols)), {}, direct,
            skipping)


def decide(entry: tuple, change, count_dropped: Callable) -> list:
    """What the plans of ``entry`` publish of ``change``: ``(plan, kind, old, old_is_key,
    new)`` for each plan that publishes it; ``count_dropped(routes)`` hears of the routes
    that drop it."""
    plans = entry[1]
    cols = entry[2]
    if cols is None:
        results = [(plan, *r) for plan in plans if (r := apply_plan(plan, change)) is not None]
        if len(results) < len(plans):
            published = {id(r[0]) for r in results}
            count_dropped(p.route for p in plans if id(p) not in published)
        return results
    # every route's decision depends only on the filtered columns' values: remember the
    # decisions (which plans publish, as what) per distinct values
    op, new, old = change.op, change.new, change.old
    key = (op, None if new is None else tuple([new[i] for i in cols]),
           None if old is None else tuple([old[i] for i in cols]))
    memory = entry[3]
    decisions = memory.get(key)
    if decisions is None:
        decisions = tuple((plan, r[0]) for plan in plans
                          if (r := apply_plan(plan, change)) is not None)
        if len(memory) >= DECISIONS_MAX:
            memory.clear()
        memory[key] = decisions
    if len(decisions) < len(plans):
        published = {id(d[0]) for d in decisions}
        count_dropped(p.route for p in plans if id(p) not in published)
    same = KINDS[op]
    # a decision that publishes the change as it is (same kind, no column mapping) needs no
    # materialized copy
    return [(plan, kind, change.old, change.old_is_key, change.new)
            if kind == same and plan.row_map is None
            else materialize(plan, kind, change) for plan, kind in decisions]
