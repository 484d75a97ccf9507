"""Topic names (``router.routing.topics``): an injective, documented mapping from identifiers to
names Kafka accepts, and the problems every topic of a route is checked for."""

from __future__ import annotations

import random
import re

import pytest

from router.routing.change_router import RouteSpec
from router.routing.topics import (
    MAX_TOPIC_LENGTH, escape, illegal, topic_name, topic_problems, unescape)

LEGAL = re.compile(r"[A-Za-z0-9._-]{1,249}")
DEFAULT = "{route}.{schema}.{table}"


@pytest.mark.parametrize("identifier, escaped", [
    ("orders", "orders"), ("Order_Items2", "Order_Items2"), ("_x", "_x"),
    ("a.b", "a-2eb"), ("my-table", "my-2dtable"), ("two words", "two-20words"),
    ('say "hi"', "say-20-22hi-22"), ("Straße", "Stra-c3-9fe"), ("表", "-e8-a1-a8"),
    ("-2e", "-2d2e"),
])
def test_escape(identifier, escaped):
    assert escape(identifier) == escaped
    assert unescape(escaped) == identifier


def test_dotted_identifiers_get_different_topics():
    spec = RouteSpec(name="r")
    assert spec.topic_for("a.b", "c") == "r.a-2eb.c"
    assert spec.topic_for("a", "b.c") == "r.a.b-2ec"
    assert spec.topic_for("public", "orders") == "r.public.orders"  # legal names unchanged


def test_mapping_is_injective_and_legal_on_random_identifiers():
    rng = random.Random(20)
    alphabet = "ab_.-9 \"'é表\\%"
    seen: dict[str, tuple[str, str]] = {}
    for _ in range(20000):
        schema = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
        table = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
        topic = topic_name(DEFAULT, "r.x", schema, table)
        assert LEGAL.fullmatch(topic), topic
        assert seen.setdefault(topic, (schema, table)) == (schema, table), topic
        _, s, t = topic.rsplit(".", 2)
        assert (unescape(s), unescape(t)) == (schema, table)


def test_illegal_topics():
    assert illegal("r.public.orders") is None
    assert "Kafka does not allow" in illegal("r.a b")
    assert "249" in illegal("x" * (MAX_TOPIC_LENGTH + 1))
    assert illegal("x" * MAX_TOPIC_LENGTH) is None
    assert illegal("..") and illegal("")


def test_route_refuses_a_topic_kafka_cannot_hold():
    from router.errors import ConfigError

    with pytest.raises(ConfigError, match="249"):
        RouteSpec(name="r").topic_for("é" * 63, "表" * 21)


def test_problems_of_every_topic_a_route_produces():
    tables = [("a.b", "c"), ("a", "b.c"), ("public", "t"), ("other", "t")]
    # the default template: no sharing, and a too long name is reported with its table
    assert topic_problems([("routes[0].topic", "r", DEFAULT, tables)]) == []
    long = [("s", "é" * 63), ("s", "ok")]
    (path, msg), = topic_problems([("routes[0].topic", "r", "{route}.{schema}.{table}.{table}."
                                    "{table}", long)])
    assert path == "routes[0].topic" and "table s." in msg and "249" in msg
    # a template that names schema and table but joins them ambiguously
    probs = topic_problems([("routes[1].topic", "r", "{route}.{schema}_{table}",
                             [("a_b", "c"), ("a", "b_c")])])
    assert probs and "would share topic 'r.a_b_c'" in probs[0][1]
    # leaving out {schema} merges tables on purpose
    assert topic_problems([("routes[0].topic", "r", "{route}.{table}", tables)]) == []
    # two topics Kafka cannot hold together, and a route writing the schema topic
    probs = topic_problems([("routes[0].topic", "r", "{route}.{table}", [("s", "a_b")]),
                            ("routes[1].topic", "r.a", "{route}.{table}", [("s", "b")])],
                           fixed=[("kafka.schema_topic", "r.s")])
    assert any("differ only in '.' and '_'" in m for _, m in probs)
    probs = topic_problems([("routes[0].topic", "r", "{route}.{table}", [("x", "s")])],
                           fixed=[("kafka.schema_topic", "r.s")])
    assert probs and "share topic 'r.s'" in probs[0][1]


def test_config_topics_kafka_cannot_hold_are_refused_at_load():
    from router.config.router import parse_config
    from router.errors import ConfigError

    base = ('[source]\ndsn = "postgresql://x"\nslot = "s"\npublications = ["p"]\n'
            '[kafka]\nbootstrap_servers = "k:9092"\n{}\n[[routes]]\nname = "r"\nall_tables = true\n')
    parse_config(base.format('messages_topic = "pg.messages"'))
    with pytest.raises(ConfigError, match=r"kafka\.messages_topic: topic 'pg messages'"):
        parse_config(base.format('messages_topic = "pg messages"'))
    with pytest.raises(ConfigError, match=r"kafka\.schema_topic: topic is empty"):
        parse_config(base.format('schema_topic = ""'))
