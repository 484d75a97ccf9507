"""Signals: rows of the signal table (``pgrouter.signals``) asking the router for a backfill,
read from the stream itself.

Rules (docs/snapshots.md "Signals"):

* ``pgrouter setup`` creates ``pgrouter.signals`` (UNLOGGED: its rows are neither streamed
  by a FOR ALL TABLES publication nor replicated; what counts is the message) and an AFTER
  INSERT trigger that writes each row as a transactional logical decoding message of prefix
  ``pgrouter.signal`` (JSON: ``id``, ``route``, ``table``, ``slot``, ``where``). Logical
  messages are not filtered by publications, so the slot streams it whatever its
  publications hold; it commits (or rolls back) with the insert, travels through the WAL (a standby promoted by
  failover has it), and is decoded when the router reaches it: also after a restart, when
  the row was inserted while the router was down.
* A signal whose ``slot`` names another slot is not for this router (ignored); null = every
  router of the database.
* ``where`` (null: every row) narrows the backfill to the rows it matches: an expression
  of the table's columns as a publication row filter allows it (``router.rowfilter``: no
  subqueries, no functions that are not immutable built-ins, one expression — never a
  statement), checked against each table's columns before any job is planned
  (``where_problem``); one that does not pass refuses the signal's job for that table. It
  is read in the chunk's READ ONLY transaction.
* Its request id is ``signal-<id>@<commit LSN>``: the same signal read again (the stream
  replays what was not confirmed) is recognised, so it is acted upon once.
"""

from __future__ import annotations

import msgspec

from ..postgres.lsn import format_lsn

PREFIX = "pgrouter.signal"


class Signal(msgspec.Struct, frozen=True):
    id: int | str | None = None
    route: str | None = None
    table: str | None = None
    slot: str | None = None
    where: str | None = None


_decoder = msgspec.json.Decoder(Signal)


def decode_signal(content: bytes) -> tuple[Signal | None, str]:
    """The signal of a message's content, or None and why it cannot be read."""
    try:
        return _decoder.decode(content), ""
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return None, f"not a signal ({exc})"


def request_id(signal: Signal | None, commit_lsn: int, seq: int) -> str:
    ident = signal.id if signal is not None and signal.id is not None else f"seq{seq}"
    return f"signal-{ident}@{format_lsn(commit_lsn)}"


def problem(signal: Signal, routes: set[str]) -> str:
    """Why the signal is refused before planning ("" when it may be planned)."""
    if not signal.route:
        return "no route named"
    if signal.route not in routes:
        return f"route {signal.route!r} is not in the config"
    return ""


def where_problem(where: str, columns) -> str:
    """Why ``where`` cannot narrow a backfill of a table of ``columns`` (``CatalogColumn``s,
    the leaf's), "" when it can."""
    from ..errors import FilterError
    from ..rowfilter import check, parser

    try:
        check.check(parser.parse(where), where, columns)
    except FilterError as exc:
        return f"where {where!r}: {exc}"
    return ""


#: what ``pgrouter setup`` runs to create the signal table and its trigger (idempotent;
#: also what an operator without superuser can run by hand: needs CREATE on the database)
SETUP_SQL = (
    "create schema if not exists pgrouter",
    "create unlogged table if not exists pgrouter.signals ("
    "id bigint generated always as identity primary key, route text not null, "
    "\"table\" text, slot text, requested_at timestamptz not null default now())",
    # (a table made before signals carried a condition)
    "alter table pgrouter.signals add column if not exists \"where\" text",
    "create or replace function pgrouter.signal() returns trigger language plpgsql as $$ "
    "begin perform pg_logical_emit_message(true, '" + PREFIX + "', json_build_object("
    "'id', new.id, 'route', new.route, 'table', new.\"table\", 'slot', new.slot, "
    "'where', new.\"where\")::text); "
    "return null; end $$",
    "drop trigger if exists signal on pgrouter.signals",
    "create trigger signal after insert on pgrouter.signals for each row "
    "execute function pgrouter.signal()",
)
