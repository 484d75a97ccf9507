"""router.routing.message_routes: logical decoding messages published by prefix (exact or glob), the
payload as written, keyed by a JSON field; in their transaction's place; pgrouter's own
prefixes never match; messages_topic goes on as before."""

from __future__ import annotations

import json

import pytest

from router.stream.changes import Change, Changes
from router.config.router import parse_config
from router.errors import ConfigError
from router.routing.message_routes import MessageRouteConfig, message_key
from router.pgoutput import Relation, RelationColumn
from router.pgoutput.messages import Message
from router.routing.change_router import ChangeRouter, RouteSpec
from router.stream.transactions import NonTransactionalMessage, Transaction

T = Relation(1, "public", "t", "d", (RelationColumn(1, "id", 23, -1),))


def txn(changes):
    return Transaction(5, 100, 100, 101, 789_000_000_000, None, None, None,
                       Changes(changes, (), None, (), frozenset(), len(changes)), len(changes))


def msg(lsn, prefix, content, transactional=True):
    return Change("message", lsn, message=Message(transactional, lsn, prefix, content))


def router(**kw):
    routes = [MessageRouteConfig(name="ord", prefix="orders.*", topic="{prefix}.events",
                                 key="id"),
              MessageRouteConfig(name="exact", prefix="audit", topic="{route}.all")]
    return ChangeRouter([RouteSpec(name="cdc", all_tables=True)], db="d",
                        message_routes=routes, **kw)


def test_messages_in_their_transaction_by_prefix_with_the_key_field():
    r = router(messages_topic="msgs", position_headers=True)
    t = txn([Change("insert", 1, T, new=("1",)),
             msg(2, "orders.created", b'{"id": "o-1", "n": 2}'),
             msg(3, "audit", b"not json"),
             msg(4, "orders.paid", b'{"id": 17}'),
             msg(5, "pgrouter.snapshot", b'{"kind": "x", "slot": "s"}'),
             msg(6, "ordersX", b'{"id": "no"}'),
             Change("insert", 7, T, new=("2",))])
    chunks = list(r.route(t))
    records = [rec for c in chunks for rec in c.records]
    ours = [(rec[0], rec[1], rec[2], rec[3][0], dict(rec[3][1:])[b"pgrouter.seq".decode()])
            for rec in records if rec[0] not in ("msgs", "cdc.public.t")]
    assert ours == [("orders.created.events", b"o-1", b'{"id": "o-1", "n": 2}',
                     ("prefix", b"orders.created"), b"1"),
                    ("exact.all", None, b"not json", ("prefix", b"audit"), b"2"),
                    ("orders.paid.events", b"17", b'{"id": 17}', ("prefix", b"orders.paid"),
                     b"3")]
    # the envelope topic gets every message but pgrouter's own, as before
    assert [json.loads(rec[2])["message"]["prefix"] for rec in records if rec[0] == "msgs"
            ] == ["orders.created", "audit", "orders.paid", "pgrouter.snapshot", "ordersX"]
    # row changes and messages in one order: the data records around the events
    assert [rec[0] for rec in records if rec[0] != "msgs"][0] == "cdc.public.t"
    assert [rec[0] for rec in records if rec[0] != "msgs"][-1] == "cdc.public.t"
    topics = {t for c in chunks for t, _ in c.new_topics}
    assert {"orders.created.events", "orders.paid.events", "exact.all"} <= topics


def test_a_non_transactional_message_at_its_own_lsn():
    r = router(position_headers=True)
    chunk = r.route_message(NonTransactionalMessage(
        900, Message(False, 900, "orders.x y", b'{"id": ["a", 1]}')))
    assert chunk.end_lsn == 0 and chunk.last
    (topic, key, value, headers), = chunk.records
    assert (topic, key, value) == ("orders.x-20y.events", b'["a",1]', b'{"id": ["a", 1]}')
    assert ("pgrouter.commit_lsn", b"900") in headers
    assert chunk.new_topics == [("orders.x-20y.events", "ord")]


@pytest.mark.parametrize("payload,key", [(b'{"id": null}', None), (b"[1]", None),
                                         (b"{bad", None), (b'{"x": 1}', None),
                                         (b'{"id": "\\u00e9"}', "é".encode()),
                                         (b'{"id": true}', b"true")])
def test_the_key_convention(payload, key):
    assert message_key(payload, "id") == key
    assert message_key(payload, "") is None


BASE = """
[source]
dsn = "postgresql://u@h/d"
slot = "s"
publications = ["p"]
{source}
[kafka]
bootstrap_servers = "k:9092"
[[routes]]
name = "r"
tables = ["public.t"]
[[message_routes]]
{route}
"""


@pytest.mark.parametrize("route,source,problem", [
    ('name = "m"\nprefix = "pgrouter.x"', "", r"message_routes\[0\]\.prefix: .*pgrouter's own"),
    ('name = "m"\nprefix = ""', "", r"message_routes\[0\]\.prefix"),
    ('name = "r"\nprefix = "a"', "", r"message_routes\[0\]\.name: duplicate route name 'r'"),
    ('name = "m"\nprefix = "a"\ntopic = "{table}"', "", r"message_routes\[0\]\.topic: unknown"),
    ('name = "m"\nprefix = "a"\ntopic = "a b{prefix}"', "", r"message_routes\[0\]\.topic: topic"),
    ('name = "m"\nprefix = "a"', "messages = false", r"message_routes\[0\]: .*messages = false"),
    ('name = "m"\nprefix = "a"\nkeys = "id"', "", r"message_routes\[0\]"),
])
def test_config_problems_are_one_line_naming_the_key(route, source, problem):
    with pytest.raises(ConfigError, match=problem) as exc:
        parse_config(BASE.format(route=route, source=source))
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("table_route", ['"r\\n"', '"r s"', '""'])
def test_a_route_name_is_checked_alike_in_routes_and_message_routes(table_route):
    """One rule for both kinds of route: a name ending in a newline was let through in
    ``[[routes]]`` (a ``$`` match) and refused in ``[[message_routes]]``."""
    text = BASE.format(route='name = "m"\nprefix = "a"', source="")
    with pytest.raises(ConfigError, match=r"(^|[^_])routes\[0\]\.name: route names use") as exc:
        parse_config(text.replace('name = "r"', f"name = {table_route}", 1))
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("topic,problem", [
    ("x{}", r"unknown placeholder\(s\) \[''\]"),
    ("x{nope}", r"unknown placeholder\(s\) \['nope'\]"),
    ("x{route", "bad topic template"),
])
@pytest.mark.parametrize("kind", ["routes", "message_routes"])
def test_a_topic_template_is_checked_alike_in_routes_and_message_routes(kind, topic, problem):
    """A positional ``{}`` in a ``[[routes]]`` topic passed the config check; naming a topic
    with it then raised IndexError (a traceback, not one line)."""
    text = BASE.format(route='name = "m"\nprefix = "a"', source="")
    at = 'tables = ["public.t"]\n' if kind == "routes" else 'prefix = "a"\n'
    text = text.replace(at, f'{at}topic = "{topic}"\n', 1)
    with pytest.raises(ConfigError, match=rf"(^|[^_]){kind}\[0\]\.topic: {problem}") as exc:
        parse_config(text)
    assert "\n" not in str(exc.value)


def test_config_loads():
    cfg = parse_config(BASE.format(route='name = "m"\nprefix = "orders.*"\nkey = "id"\n'
                                         'topic_settings = {partitions = 3}', source=""))
    assert cfg.message_routes[0].topic_settings.partitions == 3
