"""What one route does with one change of one relation layout: PostgreSQL's publication
semantics, as pgoutput.c applies them per subscription (``pgoutput_change``,
``pgoutput_row_filter``).

Rules:

* A filter that evaluates to NULL counts as false; TRUNCATE is never filtered.
* UPDATE evaluates the filter on the old and the new row: no/no → dropped, no/yes → INSERT of
  the new row, yes/no → DELETE of the old row, yes/yes → UPDATE (the new tuple as sent).
  Without an old tuple only the new row is evaluated and nothing is transformed.
  Unchanged-TOAST columns of the new row are taken from the old tuple where it has them, for
  evaluating and for a transformed INSERT. A transformed change is not checked again against
  the published actions.
* Column lists project ``before`` and ``after`` (the encoder's job); filters see the whole row.
* Publishing a partition as an ancestor maps the row to the ancestor's columns (``row_map``)
  before anything else.
"""

from __future__ import annotations

from typing import Callable

import msgspec

from ..stream.changes import Change
from ..formats.envelope import TableEncoder
from ..pgoutput import UNCHANGED_TOAST

RowPredicate = Callable[[tuple], bool]


class TablePlan(msgspec.Struct, frozen=True):
    """What one route does with one relation layout."""

    route: str
    topic: str
    encoder: TableEncoder
    publish_insert: bool = True
    publish_update: bool = True
    publish_delete: bool = True
    publish_truncate: bool = True
    #: row filters per action (None: no filtering for that action)
    insert_filter: RowPredicate | None = None
    update_filter: RowPredicate | None = None
    delete_filter: RowPredicate | None = None
    #: publishing a partition as an ancestor: source column index for each ancestor column
    row_map: tuple[int, ...] | None = None
    #: the relation is a partition published as an ancestor (pgoutput sends no TRUNCATE of
    #: it; the ancestor's own TRUNCATE comes from the marker messages, ``routing``)
    via_ancestor: bool = False
    #: source-row indexes every filter of this plan reads (None: unknown). Filters are
    #: immutable expressions, so their results depend on these values only.
    filter_columns: tuple[int, ...] | None = None
    #: a tombstone after each delete record, and of the old key after a key change
    #: (``router.formats.tombstones``)
    tombstones: bool = False
    #: ``router.routing.outbox.OutboxPlan``: the plan's inserts are outbox events, not envelopes
    outbox: object | None = None


#: the record kind of a change every plan publishes as it is
KINDS = {"insert": "c", "update": "u", "delete": "d"}


def _fill_toast(new: tuple, old: tuple) -> tuple:
    # pgoutput_row_filter: an unchanged-TOAST value of the new row is taken from the old
    # tuple only where the old tuple has a (non-NULL, not itself unchanged) value
    if UNCHANGED_TOAST not in new:
        return new
    return tuple(o if n is UNCHANGED_TOAST and o is not None and o is not UNCHANGED_TOAST
                 else n for n, o in zip(new, old))


def _mapped(row: tuple | None, row_map: tuple[int, ...] | None) -> tuple | None:
    if row_map is None or row is None:
        return row
    return tuple([row[i] for i in row_map])


def materialize(plan: TablePlan, kind: str, change: Change) -> tuple:
    """The publishable change for a remembered decision (what ``apply_plan`` returned)."""
    m = plan.row_map
    if kind == "c":
        new = change.new
        if change.op == "update":
            new = _fill_toast(new, change.old)
        return plan, "c", None, False, _mapped(new, m)
    if kind == "d":
        return plan, "d", _mapped(change.old, m), change.old_is_key, None
    old = change.old
    return (plan, "u", _mapped(old, m), change.old_is_key if old is not None else False,
            _mapped(change.new, m))


def apply_plan(plan: TablePlan, change: Change):
    """(op, old, old_is_key, new) to publish, or None to drop the change
    (pgoutput_change + pgoutput_row_filter)."""
    op = change.op
    row_map = plan.row_map
    if op == "insert" or op == "delete":  # one row: the new one, or the old one
        insert = op == "insert"
        if not (plan.publish_insert if insert else plan.publish_delete):
            return None
        row = change.new if insert else change.old
        if row_map is not None:
            row = tuple([row[i] for i in row_map])
        f = plan.insert_filter if insert else plan.delete_filter
        if f is not None and not f(row):
            return None
        return ("c", None, False, row) if insert else ("d", row, change.old_is_key, None)
    # update
    if not plan.publish_update:
        return None
    old, new = change.old, change.new
    if row_map is not None:
        new = tuple([new[i] for i in row_map])
        if old is not None:
            old = tuple([old[i] for i in row_map])
    f = plan.update_filter
    if f is None:
        return "u", old, change.old_is_key, new
    if old is None:
        # key unchanged, no old tuple: the new row alone decides, nothing is transformed
        return ("u", None, False, new) if f(new) else None
    filled = _fill_toast(new, old)
    old_match, new_match = f(old), f(filled)
    if old_match:
        if new_match:
            return "u", old, change.old_is_key, new  # the new tuple as sent, not the filled one
        return "d", old, change.old_is_key, None
    if new_match:
        return "c", None, False, filled
    return None
