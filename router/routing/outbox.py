"""Outbox routes: a table written as an outbox (the transactional outbox pattern) published
as Debezium's Outbox Event Router publishes it — each inserted row is an event.

Rules:

* Only INSERTs are events: an update or a delete of an outbox row publishes nothing, so a
  row inserted and deleted in one transaction (the usual way to keep the outbox empty)
  publishes its event once and nothing for the delete.
* The record: topic from ``[routes.outbox] topic``, a template of the row's columns (and
  ``{route}``), each value as it is, as Debezium's RegexRouter puts it (``purchase-order``
  gives ``outbox.event.purchase-order``), except that a character Kafka refuses in a topic
  name is escaped as identifiers' are (``router.routing.topics.escape``: ``a b`` → ``a-20b``; where
  Debezium's topic would be refused); key = the
  ``key`` column's text (null when NULL); value = the ``payload`` column's text as written
  (null when NULL); headers: ``id`` = the ``id`` column's text, then each ``headers`` column
  by its name (then the position headers when ``[kafka] position_headers`` is on).
* Never snapshotted (the outbox holds events already published, or none): the initial
  snapshot and backfills leave outbox routes out.
* A column the route names that the table lacks is a ``ConfigError`` when its layout is
  first met.
* A row that makes no event (``Poison``: a NULL in a column of the topic template, a topic
  Kafka refuses — its name, or one differing only in ``.`` versus ``_`` from a topic Kafka
  held at the start or the router made since (``TopicFolds``) —, a payload of a type other than ``json``, ``jsonb`` or ``bytea`` that is not
  JSON text) is, without ``dead_letter``, a ``ConfigError`` naming the route, the table, the
  row's id and key and its LSN (the router stops before confirming its transaction); with
  ``dead_letter = "topic"`` it goes there instead, in its place in the stream: key and value
  as an event's (the value the payload's bytes as written), its headers then
  ``pgrouter.error`` (the reason) and ``pgrouter.table``.
"""

from __future__ import annotations

import string

import msgspec

from ..errors import ConfigError
from ..postgres.lsn import format_lsn
from ..native import NATIVE
from ..pgoutput import Relation
from .topics import TopicFolds, escape, illegal
from ..formats.values import BYTEA, JSON, JSONB, converter_for

bytea_bytes = converter_for(BYTEA)
_json_text = msgspec.json.Decoder(msgspec.Raw)  # checks the syntax, builds nothing
_H_ERROR, _H_TABLE = "pgrouter.error", "pgrouter.table"


class Poison(Exception):
    """An outbox row that makes no event; the argument says why, in one line."""


class OutboxConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[routes.outbox]``: which columns make the event (defaults: Debezium's names)."""

    topic: str = "outbox.event.{aggregatetype}"
    key: str = "aggregateid"
    payload: str = "payload"
    id: str = "id"
    headers: list[str] = []
    #: the topic of the rows that make no event ("": such a row stops the router)
    dead_letter: str = ""


def validate_outbox(route, where: str, source: str, fmt: str) -> None:
    """What an outbox route allows: tables (the outbox tables), pgrouter's JSON format, no
    column list, tombstones or transforms; a topic template of placeholders only."""
    out = route.outbox
    if out is None:
        return
    at = f"{where}.outbox"
    if not route.tables:
        raise ConfigError("an outbox route names its outbox table(s): tables = [...]",
                          path=where, source=source)
    if fmt != "json":
        raise ConfigError('outbox routes write the payload as written: they need [kafka] '
                          f'format = "json" (not {fmt!r})', path=at, source=source)
    for key, bad in (("columns", route.columns), ("tombstones", route.tombstones),
                     ("transforms", route.transforms)):
        if bad:
            raise ConfigError(f"{key} is not for an outbox route", path=f"{where}.{key}",
                              source=source)
    try:
        parts = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(out.topic)
                 if f is not None]
    except ValueError as exc:
        raise ConfigError(f"bad topic template: {exc}", path=f"{at}.topic",
                          source=source) from exc
    if not parts or any(not f for f, _, _ in parts):
        raise ConfigError("the topic template names a column, e.g. \"{aggregatetype}.events\"",
                          path=f"{at}.topic", source=source)
    # "{aggregatetype!r}" or "{aggregatetype:>9}" would quote or pad each (escaped) value:
    # every row's topic refused by Kafka, found only when the rows come
    if any(spec or conv for _, spec, conv in parts):
        raise ConfigError("a placeholder of the topic template is a column's name only (no "
                          "'!conversion' or ':format')", path=f"{at}.topic", source=source)
    problem = illegal(out.dead_letter) if out.dead_letter else None
    if problem:
        raise ConfigError(f"topic {problem}", path=f"{at}.dead_letter", source=source)


class OutboxPlan:
    """One outbox table layout: its columns' indexes, the record of an inserted row."""

    __slots__ = ("route", "table", "template", "fields", "key", "payload", "id", "headers",
                 "dead_letter", "plain", "folds", "_topics", "_one", "_payload_bytes", "_payload_json")

    def __init__(self, cfg: OutboxConfig, relation: Relation, route: str,
                 folds: TopicFolds | None = None):
        index = {c.name: i for i, c in enumerate(relation.columns)}

        def at(column: str, what: str) -> int:
            if column not in index:
                raise ConfigError(
                    f"route {route!r}: outbox table {relation.namespace}.{relation.name} has no "
                    f"column {column!r} ({what})", path="routes.outbox")
            return index[column]
        self.route = route
        self.table = f"{relation.namespace}.{relation.name}"
        self.dead_letter = cfg.dead_letter
        #: the topics Kafka holds and the router made, by their fold (shared by the router)
        self.folds = folds if folds is not None else TopicFolds()
        # the dead-letter topic is one of the router's: an event's topic must not collide
        twin = self.folds.claim(cfg.dead_letter, (route, self.table)) if cfg.dead_letter else None
        if cfg.dead_letter:
            self.folds.reserved.setdefault(cfg.dead_letter, f"route {route!r}'s dead-letter topic")
        if twin is not None:
            raise ConfigError(f"route {route!r}: the dead-letter topic {cfg.dead_letter!r} differs "
                              f"only in '.' and '_' from the topic {twin!r}, which Kafka "
                              "cannot hold beside it", path="routes.outbox.dead_letter")
        self.template = cfg.topic
        self.fields = tuple((f, at(f, "topic"))
                            for _, f, _, _ in string.Formatter().parse(cfg.topic)
                            if f and f != "route")
        self.key, self.payload, self.id = (at(cfg.key, "key"), at(cfg.payload, "payload"),
                                           at(cfg.id, "id"))
        self.headers = tuple((name, at(name, "headers")) for name in cfg.headers)
        # a bytea payload is its bytes (what the application wrote), not their \x text
        payload_type = relation.columns[self.payload].type_oid
        self._payload_bytes = payload_type == BYTEA
        # json and jsonb are JSON (PostgreSQL checked them), bytea is bytes; a value of any
        # other type (text, varchar...) must be JSON text for a route of format "json"
        self._payload_json = payload_type not in (BYTEA, JSON, JSONB)
        # the topic of each distinct tuple of the template's values (an outbox has few
        # aggregate types: formatting and checking each event's topic was a third of its cost)
        self._topics: dict = {}
        # the column of a template naming one (the usual "outbox.event.{aggregatetype}")
        self._one = self.fields[0][1] if len(self.fields) == 1 else None
        # its events need no more than C's OutboxRecorder does (a one-column template's topic
        # remembered, text taken as UTF-8): it makes them
        self.plain = self._one is not None and not self._payload_bytes and not self._payload_json

    def topic(self, row: tuple) -> str:
        one = self._one
        values = row[one] if one is not None else tuple([row[i] for _, i in self.fields])
        topic = self._topics.get(values)
        if topic is None:
            topic = self._make_topic(row)
            if len(self._topics) >= TOPICS_KEPT:
                self._topics.clear()
            self._topics[values] = topic
        return topic

    def _make_topic(self, row: tuple) -> str:
        for name, i in self.fields:
            if row[i] is None:  # "outbox.event." would be a topic no consumer reads
                raise Poison(f"names no topic: its column {name} is NULL")
        values = {name: _in_topic(_text(row[i])) for name, i in self.fields}
        topic = self.template.format(route=self.route, **values)
        problem = illegal(topic)
        if problem:
            shown = topic if len(topic) <= 100 else topic[:100] + "…"
            raise Poison(f"makes topic {shown!r}: {problem}")
        whose = self.folds.reserved.get(topic)
        if whose is not None:
            raise Poison(f"makes topic {topic!r}, {whose}: no event goes there")
        other = self.folds.claim(topic, (self.route, self.table))
        if other is not None:
            raise Poison(f"makes topic {topic!r}, which Kafka refuses to create beside its "
                         f"topic {other!r} (they differ only in '.' and '_')")
        return topic

    def record(self, row: tuple, position: list | None) -> tuple:
        """(topic, key, value, headers) of an inserted outbox row; ``Poison`` when it makes
        no event (``dead``)."""
        value = row[self.id]  # text (binary mode is refused), or None
        headers = [("id", value.encode() if type(value) is str else _bytes(value))]
        for name, i in self.headers:
            value = row[i]
            headers.append((name, value.encode() if type(value) is str else _bytes(value)))
        if position:
            headers += position
        key, value = row[self.key], row[self.payload]
        if self._payload_bytes and type(value) is str:
            return (self.topic(row), key.encode() if type(key) is str else _bytes(key),
                    bytea_bytes(value), headers)
        if type(value) is str:
            value = value.encode()
            if self._payload_json:
                try:
                    _json_text.decode(value)
                except msgspec.DecodeError as exc:
                    raise Poison(f"its payload is not JSON ({exc})") from None
        else:
            value = _bytes(value)
        return (self.topic(row), key.encode() if type(key) is str else _bytes(key), value,
                headers)

    def dead(self, row: tuple, why: Poison, lsn: int, position: list | None) -> tuple:
        """The record of a row that makes no event: on the ``dead_letter`` topic with the
        reason in a header, else a ``ConfigError`` naming route, table, id, key and LSN."""
        key = row[self.key]
        if not self.dead_letter:
            shown = repr(key) if key is None or len(key) <= 100 else repr(key[:100]) + "…"
            raise ConfigError(f"route {self.route!r}: the outbox row of id {_text(row[self.id])} "
                              f"(table {self.table}, key {shown}, LSN {format_lsn(lsn)}) "
                              f"{why.args[0]}", path="routes.outbox")
        value = row[self.payload]
        if self._payload_bytes and type(value) is str:
            value = bytea_bytes(value)
        headers = [("id", _bytes(row[self.id]))]
        headers += [(name, _bytes(row[i])) for name, i in self.headers]
        headers += [(_H_ERROR, why.args[0].encode()), (_H_TABLE, self.table.encode())]
        if position:
            headers += position
        return (self.dead_letter, _bytes(key), value if type(value) is bytes else _bytes(value),
                headers)


#: distinct topic values remembered per outbox table layout (then forgotten at once)
TOPICS_KEPT = 4096
_KAFKA_CHARS = frozenset(string.ascii_letters + string.digits + "._-")


def _in_topic(value: str) -> str:
    """A column's value in a topic name: as it is when Kafka takes its characters (a
    Debezium consumer subscribes to ``outbox.event.<value>``), else each character Kafka
    refuses escaped."""
    if _KAFKA_CHARS.issuperset(value):
        return value
    return "".join(c if c in _KAFKA_CHARS else escape(c) for c in value)


def _text(value) -> str | None:
    if value is None or type(value) is str:
        return value
    return "\\x" + value.hex()  # bytea in binary mode (refused at config load)


def _bytes(value) -> bytes | None:
    text = _text(value)
    return None if text is None else text.encode()


class OutboxEncoder:
    """An outbox plan in the router's direct path (``ChangeRouter._dispatch_for``): a
    ``recorder`` as ``TableEncoder.recorder`` makes, whose records are the plan's events
    (inserts only), each new topic told to ``new_topic(topic, route)``; no schema (an
    event has none)."""

    __slots__ = ("plan", "new_topic", "seen", "_made")
    schema = None

    def __init__(self, plan: OutboxPlan, new_topic, seen: set):
        self.plan, self.new_topic, self.seen = plan, new_topic, seen
        self._made: tuple | None = None

    def recorder(self, tx, topic: str, lsn_header: tuple | None, seq_name: str):
        made = self._made
        if made is not None and made[0] is tx and made[1] is lsn_header:
            return made[2]
        record_of, new_topic, seen, route = (self.plan.record, self.new_topic, self.seen,
                                             self.plan.route)
        dead = self.plan.dead

        def record(kind, lsn, seq, old, old_is_key, row):
            position = [lsn_header, (seq_name, b"%d" % seq)] if lsn_header else None
            try:
                rec = record_of(row, position)
            except Poison as why:
                rec = dead(row, why, lsn, position)
            if rec[0] not in seen:
                new_topic(rec[0], route)
            return rec
        plan = self.plan
        if NATIVE is not None and plan.plain:  # the closure makes what C leaves
            record = NATIVE.OutboxRecorder(plan._topics, plan._one, plan.key, plan.payload,
                                           plan.id, plan.headers, lsn_header, seq_name, record)
        self._made = (tx, lsn_header, record)
        return record


def _utf8(value) -> bytes | None:
    return None if value is None else value.encode()


class PyOutboxRecorder:
    """``router._native.OutboxRecorder`` in Python, its twin (with C off the router uses the
    closure of ``OutboxEncoder.recorder`` alone): the event of a plain row (a tuple of str or
    None at the columns it reads, a topic column not NULL whose topic ``topics`` remembers),
    ``fallback``'s record otherwise."""

    __slots__ = ("topics", "one", "key", "payload", "id", "headers", "lsn_header", "seq_name",
                 "fallback")

    def __init__(self, topics: dict, one: int, key: int, payload: int, id: int,
                 headers: tuple, lsn_header: tuple | None, seq_name: str, fallback):
        self.topics, self.one, self.key, self.payload, self.id = topics, one, key, payload, id
        self.headers, self.lsn_header, self.seq_name = headers, lsn_header, seq_name
        self.fallback = fallback

    def __call__(self, kind, lsn, seq, old, old_is_key, row):
        at = (self.one, self.key, self.payload, self.id, *(i for _, i in self.headers))
        if (type(row) is not tuple or len(row) <= max(at) or row[self.one] is None
                or any(row[i] is not None and type(row[i]) is not str for i in at)
                or row[self.one] not in self.topics):
            return self.fallback(kind, lsn, seq, old, old_is_key, row)
        try:
            headers = [("id", _utf8(row[self.id]))]
            headers += [(name, _utf8(row[i])) for name, i in self.headers]
            key, value = _utf8(row[self.key]), _utf8(row[self.payload])
        except UnicodeEncodeError:
            return self.fallback(kind, lsn, seq, old, old_is_key, row)
        if self.lsn_header is not None:
            headers += [self.lsn_header, (self.seq_name, b"%d" % seq)]
        return (self.topics[row[self.one]], key, value, headers)
