"""Kafka topic names for routed tables: a documented, injective mapping from PostgreSQL
identifiers to names Kafka accepts, and the checks every topic a route can produce must pass.

Rules (README "Topic names"):

* Kafka accepts topic names of ``[A-Za-z0-9._-]``, at most 249 characters, not ``.`` or
  ``..``. It also refuses to hold two topics that differ only in ``.`` versus ``_`` (their
  metric names collide).
* A schema or table name is written into a template (``{schema}``, ``{table}``) escaped:
  ASCII letters, digits and ``_`` stay as they are; every other character — ``.``, ``-``,
  space, quotes, non-ASCII — becomes ``-hh`` for each byte of its UTF-8 form (lowercase
  hex). So an escaped identifier never contains ``.``, the default template
  ``{route}.{schema}.{table}`` splits back into its parts, and ``"a.b".c`` (``r.a-2eb.c``)
  and ``a."b.c"`` (``r.a.b-2ec``) get different topics. Names made of letters, digits and
  ``_`` — what PostgreSQL accepts unquoted, in ASCII — keep the topics they always had.
* A route name is written as it is and must consist of Kafka's characters: it is the
  operator's own choice, and the template ends with the escaped identifiers, so for one
  route the mapping stays injective with any route name.
* Every topic a route can produce must be legal; two different tables may share a topic
  only when the template leaves out ``{table}`` (or ``{schema}``) on purpose. These are
  checked by ``topic_problems`` — by ``pgrouter check`` and by ``run`` before it streams —
  and a topic for a table created later is checked when the router first meets it.
"""

from __future__ import annotations

import re
import string

from ..errors import ConfigError, SinkError, SinkRejected, SinkUnavailable


MAX_TOPIC_LENGTH = 249
_LEGAL = re.compile(r"[A-Za-z0-9._-]+")
_KEPT = frozenset(string.ascii_letters + string.digits + "_")

TableName = tuple[str, str]


class TopicSpec:
    """A topic to create when missing: name, partitions, replication factor, configs."""

    __slots__ = ("name", "partitions", "replication_factor", "configs")

    def __init__(self, name: str, partitions: int = 1, replication_factor: int = 1,
                 configs: dict[str, str] | None = None):
        self.name = name
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.configs = configs or {}


class TopicFolds:
    """The topics Kafka holds or the router made, by Kafka's metric name for them (``.`` as
    ``_``): a new topic whose fold another topic holds is one Kafka refuses to create. Also
    who made each topic the router's outbox routes made (``owner``: an error line about a
    record names its route and table)."""

    __slots__ = ("_by_fold", "_owners", "reserved")

    def __init__(self, names=(), reserved: dict[str, str] | None = None):
        self._by_fold: dict[str, str] = {}
        self._owners: dict[str, dict[tuple[str, str], None]] = {}
        #: topics no outbox event may go to -> whose they are (the router's own topics and
        #: table routes' topics: an event there would be a record their readers cannot read)
        self.reserved: dict[str, str] = dict(reserved or {})
        for name in names:
            self._by_fold.setdefault(name.replace(".", "_"), name)

    def claim(self, topic: str, owner: tuple[str, str] | None = None) -> str | None:
        """The topic ``topic`` collides with (they differ only in ``.`` versus ``_``), else
        None and ``topic`` is known from now on, made by ``owner`` (route, table) if given."""
        other = self._by_fold.setdefault(topic.replace(".", "_"), topic)
        if other != topic:
            return other
        if owner is not None:
            self._owners.setdefault(topic, {})[owner] = None
        return None

    def owner(self, topic: str) -> str | None:
        """``route 'r', outbox table s.t`` (tables and routes joined by "or"), or None."""
        owners = self._owners.get(topic)
        if not owners:
            return None
        return " or ".join(f"route {route!r}, outbox table {table}" for route, table in owners)


def own_topics(cfg, routes=()) -> dict[str, str]:
    """The router's own topics of ``cfg`` (a router ``Config``) and the topics of the tables
    ``routes`` (``RouteSpec``s) name, but an outbox route's -> whose they are."""
    out: dict[str, str] = {}
    for spec in routes:
        for table in sorted(spec.tables) if spec.outbox is None and spec.planner is None else ():
            try:
                topic = spec.topic_for(*table)
            except ConfigError:  # refused by the start's checks, or when its rows come
                continue
            out[topic] = f"route {spec.name!r}'s topic of table {'.'.join(table)}"
    kafka = cfg.kafka
    named = {f"[kafka] {key}": getattr(kafka, key, "") for key in (
        "schema_topic", "messages_topic", "transactions_topic", "committed_lsn_topic",
        "definitions_topic")}
    named["[snapshot] state_topic"] = cfg.snapshot.state_topic
    out.update((topic, f"the router's {key} topic") for key, topic in named.items() if topic)
    return out


def collision(name: str, twin: str, listed: frozenset | None) -> SinkError:
    """Kafka refusing to create ``name`` beside its topic ``twin`` (they differ only in ``.``
    versus ``_``). ``listed``: the topics Kafka held at the start, which the outbox routes'
    ``TopicFolds`` hold (None: not read, no outbox route). A twin made since (by another
    tool, say) is a restart: the next start's folds hold it, and the outbox row making
    ``name`` is a dead letter or the outbox's stop line then. A twin known at the start is a
    stop."""
    if listed is not None and twin not in listed:
        return SinkUnavailable(f"topic {twin!r}, made since the start, differs only in '.' and "
                               f"'_' from the topic {name!r} a route makes, which Kafka cannot "
                               "hold beside it; restarting to route past it")
    return SinkRejected(f"Kafka cannot create topic {name!r}: it differs only in '.' and '_' "
                        f"from its topic {twin!r} (their metric names collide); change the "
                        "route's topic or delete the other topic")


def twin_of(name: str, existing) -> str | None:
    """The topic of ``existing`` differing from ``name`` only in ``.`` versus ``_``, or None."""
    fold = name.replace(".", "_")
    return next((t for t in existing if t != name and t.replace(".", "_") == fold), None)


_COLLIDES = re.compile(r"collides with existing topics?: ?\[?'?([A-Za-z0-9._-]+)")


def twin_named(message: str) -> str | None:
    """The topic Kafka's "Topic 'x' collides with existing topic: y" names, or None."""
    found = _COLLIDES.search(message)
    return found.group(1) if found else None


def escape(identifier: str) -> str:
    """A schema or table name as it appears in a topic name (see the module rules)."""
    if _KEPT.issuperset(identifier):
        return identifier
    return "".join(c if c in _KEPT else "".join(f"-{b:02x}" for b in c.encode())
                   for c in identifier)


def unescape(text: str) -> str:
    """The identifier ``escape`` made ``text`` from (its inverse)."""
    out = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "-":
            out.append(int(text[i + 1:i + 3], 16))
            i += 3
        else:
            out += text[i].encode()
            i += 1
    return out.decode()


def topic_name(template: str, route: str, schema: str, table: str) -> str:
    """The topic ``template`` gives a table of ``route``."""
    return template.format(route=route, schema=escape(schema), table=escape(table))


def illegal(topic: str) -> str | None:
    """Why Kafka would refuse ``topic`` as a name, or None."""
    if not topic:
        return "is empty"
    if topic in (".", ".."):
        return f"{topic!r} is not a legal topic name"
    if len(topic) > MAX_TOPIC_LENGTH:
        return (f"is {len(topic)} characters long, Kafka allows {MAX_TOPIC_LENGTH} "
                f"({topic[:40]}…)")
    if not _LEGAL.fullmatch(topic):
        bad = sorted({c for c in topic if not _LEGAL.fullmatch(c)})
        return (f"{topic!r} has character(s) {''.join(bad)!r} that Kafka does not allow "
                "(letters, digits, '.', '_', '-')")
    return None


def template_problem(template: str, fields: set[str]) -> str | None:
    """Why ``template`` is not a topic template over ``fields`` (e.g. ``{route}``), or None:
    a stray brace, or a placeholder not among them (a positional ``{}`` is none of them)."""
    try:
        used = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        return f"bad topic template: {exc}"
    if used - fields:
        return (f"unknown placeholder(s) {sorted(used - fields)}; use "
                + ", ".join(f"{{{f}}}" for f in sorted(fields)))
    return None


def route_name_problem(name: str, template: str) -> str | None:
    """Why a route name used in a topic template cannot be, or None: it must be made of
    Kafka's characters."""
    if "{route}" in template and not _LEGAL.fullmatch(name):
        return (f"route name {name!r} appears in the topic template but has characters a "
                "Kafka topic cannot hold; use letters, digits, '.', '_', '-'")
    return None


def topic_problems(routes: list[tuple[str, str, str, list[TableName]]],
                   fixed: list[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """Problems of every topic the routes can produce, as (config key path, message).

    ``routes``: (path of the route's ``topic``, route name, template, the tables it takes,
    as they are published). ``fixed``: (path, topic) of topics named in the config
    (schema, messages, transactions topics)."""
    out: list[tuple[str, str]] = []
    owners: dict[str, tuple[str, TableName | None, bool]] = {}
    folded: dict[str, str] = {}

    def claim(path: str, topic: str, owner: tuple[str, TableName | None], shared_ok: bool):
        owner = (*owner, shared_ok)
        problem = illegal(topic)
        if problem:
            what = "" if owner[1] is None else f"table {'.'.join(owner[1])}: "
            out.append((path, f"{what}topic {problem}"))
            return
        prev = owners.get(topic)
        if prev is None:
            owners[topic] = owner
            fold = topic.replace(".", "_")
            other = folded.setdefault(fold, topic)
            if other != topic:
                out.append((path, f"topics {other!r} and {topic!r} differ only in '.' and "
                                  "'_'; Kafka cannot hold both"))
        elif prev != owner and not (shared_ok and prev[2]):
            def who(o):
                return (f"route {o[0]!r}" if o[1] is None
                        else f"route {o[0]!r} table {'.'.join(o[1])}")
            out.append((path, f"{who(owner)} and {who(prev)} would share topic {topic!r}"))

    for path, topic in fixed:
        if topic:
            claim(path, topic, (path, None), False)
    for path, route, template, tables in routes:
        problem = route_name_problem(route, template)
        if problem:
            out.append((path, problem))
            continue
        # a template without {table} (or {schema}) merges tables on purpose
        shared_ok = "{table}" not in template or "{schema}" not in template
        for table in sorted(set(tables)):
            claim(path, topic_name(template, route, *table), (route, table), shared_ok)
    return list(dict.fromkeys(out))
