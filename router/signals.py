"""Signals: rows of the signal table (``pgrouter.signals``) asking the router for a backfill,
read from the stream itself.

Rules (docs/snapshots.md "Signals"):

* ``pgrouter setup`` creates ``pgrouter.signals`` (UNLOGGED: its rows are neither streamed
  by a FOR ALL TABLES publication nor replicated; what counts is the message) and an AFTER
  INSERT trigger that writes each row as a transactional logical decoding message of prefix
  ``pgrouter.signal`` (JSON: ``id``, ``route``, ``table``, ``slot``). Logical messages are not
  filtered by publications, so the slot streams it whatever its publications hold; it
  commits (or rolls back) with the insert, travels through the WAL (a standby promoted by
  failover has it), and is decoded when the router reaches it: also after a restart, when
  the row was inserted while the router was down.
* A signal whose ``slot`` names another slot is not for this router (ignored); null = every
  router of the database.
* Its request id is ``signal-<id>@<commit LSN>``: the same signal read again (the stream
  replays what was not confirmed) is recognised, so it is acted upon once.
"""

from __future__ import annotations

import msgspec

from .lsn import format_lsn

PREFIX = "pgrouter.signal"


class Signal(msgspec.Struct, frozen=True):
    id: int | str | None = None
    route: str | None = None
    table: str | None = None
    slot: str | None = None


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


#: what ``pgrouter setup`` runs to create the signal table and its trigger (idempotent;
#: also what an operator without superuser can run by hand: needs CREATE on the database)
SETUP_SQL = (
    "create schema if not exists pgrouter",
    "create unlogged table if not exists pgrouter.signals ("
    "id bigint generated always as identity primary key, route text not null, "
    "\"table\" text, slot text, requested_at timestamptz not null default now())",
    "create or replace function pgrouter.signal() returns trigger language plpgsql as $$ "
    "begin perform pg_logical_emit_message(true, '" + PREFIX + "', json_build_object("
    "'id', new.id, 'route', new.route, 'table', new.\"table\", 'slot', new.slot)::text); "
    "return null; end $$",
    "drop trigger if exists signal on pgrouter.signals",
    "create trigger signal after insert on pgrouter.signals for each row "
    "execute function pgrouter.signal()",
)
