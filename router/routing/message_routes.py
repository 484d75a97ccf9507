"""Message routes: logical decoding messages (``pg_logical_emit_message``) published by their
prefix as outbox events — the outbox pattern without an outbox table.

Rules (docs/record-formats.md "Message routes"):

* ``[[message_routes]]``: ``prefix`` is the message's prefix exactly, or a glob pattern
  (``*``, ``?``, ``[...]``, as ``fnmatch.fnmatchcase``) when it holds one of ``*?[``. Every
  route whose prefix matches publishes the message (as every route taking a table does).
  Prefixes starting with ``pgrouter.`` are pgrouter's own (watermarks, definitions, TRUNCATE
  markers, signals) and never match.
* The record: topic = ``topic`` with ``{prefix}`` (the prefix, each character Kafka refuses
  in a topic name written ``-hh`` per UTF-8 byte) and ``{route}``; value = the payload as
  written (bytes, unchanged); key = with ``key = "field"`` the payload's top-level JSON field
  of that name (a string as its text, anything else as its JSON text), null when ``key`` is
  empty, the payload is not a JSON object or lacks the field (or it is JSON null); header
  ``prefix`` = the message's prefix (then the position headers when ``[kafka]
  position_headers`` is on).
* Transactional messages are records of their transaction, at their place in it (the same
  ``(commit_lsn, seq)`` counting as its row changes): in commit order, in the same Kafka
  transaction under exactly-once. Non-transactional ones are published when decoded, at
  their own LSN (``seq`` 0), at least once (docs/delivery.md).
* ``[kafka] messages_topic`` is independent: it still gets every message in pgrouter's
  envelope.
"""

from __future__ import annotations

import fnmatch
import string

import msgspec

from ..errors import ConfigError
from .topics import illegal, template_problem

#: prefixes pgrouter writes itself (router.snapshot.core, router.routing.definitions, signals)
RESERVED = "pgrouter."
_GLOB = frozenset("*?[")
_TOPIC_FIELDS = {"prefix", "route"}
_LEGAL = frozenset(string.ascii_letters + string.digits + "._-")
_json = msgspec.json.Decoder()


class MessageTopicSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    partitions: int = 1
    replication_factor: int = 1
    configs: dict[str, str] = {}


class MessageRouteConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One ``[[message_routes]]`` entry."""

    name: str
    prefix: str
    topic: str = "{prefix}"
    key: str = ""
    topic_settings: MessageTopicSettings = msgspec.field(default_factory=MessageTopicSettings)


def claim_route_name(name: str, names: set, path: str, source: str) -> None:
    """A route's name, of ``[[routes]]`` or ``[[message_routes]]`` (one namespace): letters,
    digits, '.', '_' and '-', unique among all routes; added to ``names``."""
    if not name or not set(name) <= _LEGAL:
        raise ConfigError("route names use letters, digits, '.', '_' and '-'", path=path,
                          source=source)
    if name in names:
        raise ConfigError(f"duplicate route name {name!r}", path=path, source=source)
    names.add(name)


def validate_message_routes(routes: list, names: set, messages: bool, source: str) -> None:
    """Names unique among all routes, a prefix, a topic template of ``{prefix}``/``{route}``,
    settings above zero, and messages asked of pgoutput."""
    for i, r in enumerate(routes):
        at = f"message_routes[{i}]"
        claim_route_name(r.name, names, f"{at}.name", source)
        if not r.prefix:
            raise ConfigError("a prefix (or a glob pattern of prefixes) is needed",
                              path=f"{at}.prefix", source=source)
        if r.prefix.startswith(RESERVED):
            raise ConfigError(f"prefixes starting with {RESERVED!r} are pgrouter's own",
                              path=f"{at}.prefix", source=source)
        problem = template_problem(r.topic, _TOPIC_FIELDS)
        if problem:
            raise ConfigError(problem, path=f"{at}.topic", source=source)
        problem = illegal(r.topic.format(prefix="p", route=r.name))
        if problem:
            raise ConfigError(f"topic {problem}", path=f"{at}.topic", source=source)
        s = r.topic_settings
        if s.partitions < 1 or s.replication_factor < 1:
            raise ConfigError("partitions and replication_factor must be >= 1",
                              path=f"{at}.topic_settings", source=source)
        if not messages:
            raise ConfigError("message routes need logical decoding messages: remove "
                              "[source] messages = false", path=f"{at}", source=source)


def escape_prefix(prefix: str) -> str:
    """``prefix`` with each character Kafka refuses in a topic name as ``-hh`` per byte."""
    if _LEGAL.issuperset(prefix):
        return prefix
    return "".join(c if c in _LEGAL else "".join(f"-{b:02x}" for b in c.encode())
                   for c in prefix)


def message_key(payload: bytes, field: str) -> bytes | None:
    """The record key of a payload (see the module rules)."""
    if not field:
        return None
    try:
        doc = _json.decode(payload)
    except msgspec.DecodeError:
        return None
    if type(doc) is not dict:
        return None
    value = doc.get(field)
    if value is None:
        return None
    if type(value) is str:
        return value.encode()
    return msgspec.json.encode(value)


class MessageRoutes:
    """The message routes of a router: which routes a prefix goes to (remembered per
    prefix), and the records of one message."""

    __slots__ = ("routes", "_by_prefix")

    def __init__(self, routes: list):
        self.routes = tuple(routes)
        self._by_prefix: dict[str, tuple] = {}

    def _matching(self, prefix: str) -> tuple:
        hit = self._by_prefix.get(prefix)
        if hit is None:
            hit = ()
            if not prefix.startswith(RESERVED):
                hit = tuple(
                    (r, r.topic.format(prefix=escape_prefix(prefix), route=r.name))
                    for r in self.routes
                    if (fnmatch.fnmatchcase(prefix, r.prefix) if _GLOB & set(r.prefix)
                        else prefix == r.prefix))
            for r, topic in hit:
                problem = illegal(topic)
                if problem:  # a prefix long enough to exceed Kafka's limit
                    raise ConfigError(f"message route {r.name!r}: prefix {prefix!r} makes "
                                      f"topic {topic!r}: {problem}",
                                      path="message_routes.topic")
            if len(self._by_prefix) >= 4096:
                self._by_prefix.clear()
            self._by_prefix[prefix] = hit
        return hit

    def records(self, prefix: str, content: bytes, position: list | None, out: list,
                new_topic) -> None:
        """The records of one message into ``out``; ``new_topic(topic, route)`` for each."""
        for route, topic in self._matching(prefix):
            headers = [("prefix", prefix.encode())]
            if position:
                headers += position
            out.append((topic, message_key(content, route.key), bytes(content), headers))
            new_topic(topic, route.name)
