"""Publication definitions in force at a position of the stream.

pgoutput decodes each change with the catalog as of the change's position, so a subscriber
of a publication sees the old row filter, column list, table set and actions up to an
``ALTER PUBLICATION`` — including the changes of the ALTER's own transaction before it — and
the new ones after it. Routes that follow a publication do the same from *definitions
messages*: transactional logical decoding messages with prefix ``PREFIX`` that the event
trigger (``actors/services/publication_trigger.py``) emits right after each DDL command
that changed them. Their content is JSON::

    {"v": 1, "event": "change" | "baseline", "tag": "ALTER PUBLICATION",
     "before": SNAPSHOT | null, "after": SNAPSHOT}
    SNAPSHOT = {"publications": {name: {"all_tables", "insert", "update", "delete",
                                        "truncate", "via_root", "generated_columns",
                                        "schemas": [...],
                                        "tables": [[schema, table, where|null, cols|null]]}},
                "tables": [{"schema", "name", "relkind", "replica_identity",
                            "ancestors": [[schema, table], ...], "columns":
                            [[name, type_oid, typmod, key, generated], ...]}]}

Rules:

* A snapshot holds every publication of the database and every table of a partition tree,
  and on PostgreSQL 18+ every table with a stored generated column (which a Relation message
  does not flag); other plain tables are described by the stream's own Relation messages
  (``publications.table_from_relation``). Snapshots written before ``generated_columns``
  existed read as publications without it.
* ``Definitions`` is the state shared by every router of one pipeline: ``apply`` adopts a
  message's ``after`` and bumps ``version``; each router rebuilds its plans when it sees a new
  version, also in the middle of a transaction (``routing.ChangeRouter``).
* Durability: every applied message yields a *state record* (key = slot name) for the
  definitions topic, routed with the message's transaction, so the slot is confirmed past
  a message only once its record is in Kafka. At start the definitions in force at the
  slot's confirmed position are those of the latest state record whose transaction ended at
  or before it (``state_at``); later records belong to transactions the server sends again.
* A route publication missing from a snapshot (not created yet, or dropped) publishes
  nothing, like a publication that lists no table.
"""

from __future__ import annotations

from typing import Callable

import msgspec

from ..errors import ProtocolViolation
from .publications import Catalog, CatalogColumn, Publication, PubTable, TableInfo

PREFIX = "pgrouter.publications"
#: prefix of the transactional message a TRUNCATE of a partitioned table emits (the statement
#: trigger ``pgrouter setup`` puts on every partitioned table); content: ``["schema", "name"]``
TRUNCATE_PREFIX = "pgrouter.truncate"


class _Message(msgspec.Struct):
    v: int
    after: dict
    event: str = "change"
    tag: str = ""
    before: dict | None = None


_decoder = msgspec.json.Decoder(_Message)


def parse_message(content: bytes) -> _Message:
    try:
        return _decoder.decode(content)
    except msgspec.DecodeError as exc:
        raise ProtocolViolation(f"definitions message ({PREFIX}) is not valid: {exc}") from exc


def catalog_from_snapshot(snapshot: dict) -> Catalog:
    """A ``Catalog`` (publications + partitioned tables) from a snapshot's JSON object."""
    pubs = {}
    for name, p in snapshot.get("publications", {}).items():
        tables = {(t[0], t[1]): PubTable(where=t[2], columns=tuple(t[3]) if t[3] else None)
                  for t in p.get("tables", ())}
        pubs[name] = Publication(
            name=name, all_tables=p["all_tables"], insert=p["insert"], update=p["update"],
            delete=p["delete"], truncate=p["truncate"], via_root=p["via_root"],
            schemas=frozenset(p.get("schemas", ())), tables=tables,
            generated_columns=p.get("generated_columns", False))
    infos = {}
    for t in snapshot.get("tables", ()):
        infos[(t["schema"], t["name"])] = dict(
            relkind=t["relkind"], replica_identity=t["replica_identity"],
            ancestors=tuple((a[0], a[1]) for a in t["ancestors"]),
            # c[4]: a stored generated column (tables that have one are listed on 18+)
            columns=tuple(CatalogColumn(c[0], c[1], c[2], bool(c[3]), len(c) > 4 and bool(c[4]))
                          for c in t["columns"]))
    leaves: dict = {}
    for name, info in infos.items():
        if info["relkind"] != "p":
            for anc in info["ancestors"]:
                leaves.setdefault(anc, set()).add(name)
    tables = {name: TableInfo(schema=name[0], name=name[1],
                              leaves=frozenset(leaves.get(name, ())), **info)
              for name, info in infos.items()}
    return Catalog(publications=pubs, tables=tables)


def with_missing(catalog: Catalog, names) -> Catalog:
    """``catalog`` with an empty publication for each of ``names`` it lacks."""
    missing = [n for n in names if n not in catalog.publications]
    if not missing:
        return catalog
    pubs = dict(catalog.publications)
    for n in missing:
        pubs[n] = Publication(name=n)
    return Catalog(publications=pubs, tables=catalog.tables)


class StateRecord(msgspec.Struct, kw_only=True):
    """What the definitions topic holds per applied message."""

    slot: str
    commit_lsn: int
    end_lsn: int
    lsn: int
    snapshot: msgspec.Raw


_state_encoder = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(StateRecord)


def decode_state(value: bytes) -> StateRecord | None:
    try:
        return _state_decoder.decode(value)
    except msgspec.DecodeError:
        return None


def state_at(values, slot: str, confirmed_lsn: int) -> StateRecord | None:
    """The latest state record of ``slot`` whose transaction ended at or before
    ``confirmed_lsn`` (``values``: the definitions topic's record values, any order)."""
    best = None
    for value in values:
        rec = decode_state(value)
        if rec is None or rec.slot != slot or rec.end_lsn > confirmed_lsn:
            continue
        if best is None or (rec.end_lsn, rec.lsn) > (best.end_lsn, best.lsn):
            best = rec
    return best


class Definitions:
    """The definitions in force at the pipeline's position. ``build(catalog)`` turns a catalog
    into the full list of ``RouteSpec``s; ``routes`` is the latest list."""

    def __init__(self, catalog: Catalog, build: Callable[[Catalog], list], *, slot: str,
                 topic: str, route_publications=(), on_change=None):
        self._build = build
        self._names = tuple(route_publications)
        self.slot = slot
        self.topic = topic
        self.on_change = on_change  # called with (message, catalog) after each change
        self.version = 0
        self.catalog = with_missing(catalog, self._names)
        self.routes = build(self.catalog)

    def apply(self, content: bytes, *, lsn: int, commit_lsn: int, end_lsn: int) -> tuple:
        """Adopt a definitions message; returns the state record for the definitions topic
        as ``(topic, key, value, headers)``."""
        msg = parse_message(content)
        catalog = with_missing(catalog_from_snapshot(msg.after), self._names)
        self.routes = self._build(catalog)
        self.catalog = catalog
        self.version += 1
        if self.on_change is not None:
            self.on_change(msg, catalog)
        value = _state_encoder.encode(StateRecord(
            slot=self.slot, commit_lsn=commit_lsn, end_lsn=end_lsn, lsn=lsn,
            snapshot=msgspec.Raw(_state_encoder.encode(msg.after))))
        return (self.topic, self.slot.encode(), value, None)
