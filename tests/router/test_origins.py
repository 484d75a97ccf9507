"""Origin policies (router.stream.origins), their config keys, and transaction metadata records
(router.routing.transaction_meta)."""

from __future__ import annotations

import json

import pytest

from router.config.router import parse_config
from router.errors import ConfigError
from router.stream.origins import (
    ALL_ROUTES, ANY_POLICY, NO_ROUTE, NONE_POLICY, OriginConfig, OriginPolicy, OriginRules,
    parse_policy, rules_from_config,
)
from router.pgoutput import Begin, Commit, Insert, Origin, Relation, RelationColumn
from router.stream.relations import RelationCache
from router.routing.change_router import ChangeRouter, RouteSpec
from router.routing.transaction_meta import TransactionMeta
from router.stream.transactions import TransactionAssembler

LISTS = OriginPolicy
# (policy, origin name or None for local, published?)
CASES = [
    (ANY_POLICY, None, True),
    (ANY_POLICY, "node_a", True),
    (NONE_POLICY, None, True),
    (NONE_POLICY, "node_a", False),
    (NONE_POLICY, "", False),  # an empty origin name is still an origin
    (LISTS("lists", allow=("node_a",)), "node_a", True),
    (LISTS("lists", allow=("node_a",)), "node_ab", False),
    (LISTS("lists", allow=("node_a",)), None, True),
    (LISTS("lists", allow=("node_a*",)), "node_ab", True),
    (LISTS("lists", allow=("node_a*",)), "Node_ab", False),  # case-sensitive
    (LISTS("lists", allow=("node_?",)), "node_b", True),
    (LISTS("lists", allow=("node_[ab]",)), "node_c", False),
    (LISTS("lists", allow=("node_a", "pg_*")), "pg_16384", True),
    (LISTS("lists", deny=("node_b",)), "node_b", False),
    (LISTS("lists", deny=("node_b",)), "node_a", True),
    (LISTS("lists", deny=("node_b",)), None, True),
    (LISTS("lists", allow=("node_*",), deny=("node_c",)), "node_c", False),
    (LISTS("lists", allow=("node_*",), deny=("node_c",)), "node_d", True),
    (LISTS("lists", allow=("node_*",), local=False), None, False),
    (LISTS("lists", allow=("node_*",), local=False), "node_x", True),
    (LISTS("lists", allow=("a*b",)), "a*b", True),
]


@pytest.mark.parametrize("policy,origin,expected", CASES)
def test_policy_accepts(policy, origin, expected):
    assert policy.accepts(origin) is expected


def _cfg(extra: str = "", route_extra: str = "", top: str = "") -> str:
    return f"""{top}
[source]
dsn = "postgresql://u@h/db"
slot = "s"
publications = ["p"]
[kafka]
bootstrap_servers = "k:9092"
{extra}
[[routes]]
name = "r1"
tables = ["public.t"]
{route_extra}
[[routes]]
name = "r2"
tables = ["public.t"]
"""


def test_config_forms():
    assert rules_from_config(parse_config(_cfg())).passes_everything
    rules = rules_from_config(parse_config(_cfg(top='origin = "none"')))
    assert rules.default == NONE_POLICY and rules.everywhere_none
    rules = rules_from_config(parse_config(_cfg(extra='[origin]\npolicy = "none"')))
    assert rules.default == NONE_POLICY
    rules = rules_from_config(parse_config(_cfg(extra='[origin]\nallow = ["node_a*"]')))
    assert rules.default == OriginPolicy("lists", allow=("node_a*",))
    rules = rules_from_config(parse_config(_cfg(route_extra='origin = "none"')))
    assert rules.per_route == {"r1": NONE_POLICY, "r2": ANY_POLICY}
    rules = rules_from_config(parse_config(_cfg(route_extra='origin = {deny = ["x"]}')))
    assert rules.per_route["r1"] == OriginPolicy("lists", deny=("x",))
    cfg = parse_config(_cfg(extra='transactions_topic = "tx"'))
    assert cfg.kafka.transactions_topic == "tx"


@pytest.mark.parametrize("text,path", [
    (_cfg(top='origin = "nobody"'), "origin"),
    (_cfg(extra='[origin]\npolicy = "none"\nallow = ["a"]'), "origin.policy"),
    (_cfg(extra='[origin]\nallow = [""]'), "origin.allow[0]"),
    (_cfg(extra='[origin]\npolicy = "any"\nlocal = false'), "origin.local"),
    (_cfg(extra='[origin]\nallowed = ["a"]'), "origin"),  # message names `allowed`
    (_cfg(route_extra='origin = "sometimes"'), "routes[0].origin"),
    (_cfg(route_extra='origin = {deny = [""]}'), "routes[0].origin.deny[0]"),
])
def test_config_errors_name_the_key(text, path):
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert info.value.path == path, str(info.value)


def test_parse_policy_direct():
    assert parse_policy(None, path="x") is None
    assert parse_policy(OriginConfig(), path="x") == ANY_POLICY
    assert parse_policy(OriginConfig(policy="none"), path="x") == NONE_POLICY


def test_rules_decide_per_route():
    rules = OriginRules(ANY_POLICY, {"r1": NONE_POLICY, "r2": None,
                                     "r3": OriginPolicy("lists", allow=("node_a",))})
    assert rules.decide(None) is ALL_ROUTES
    assert rules.decide("node_a") == frozenset({"r2", "r3"})
    assert rules.decide("node_b") == frozenset({"r2"})
    assert not rules.passes_everything
    none = OriginRules(NONE_POLICY, {"r1": None, "r2": None})
    assert none.decide("node_a") is NO_ROUTE and none.decide(None) is ALL_ROUTES
    assert none.decide("node_a") is NO_ROUTE  # cached


def test_server_side_only_on_pg16_when_none_everywhere():
    none = OriginRules(NONE_POLICY, {"r1": None})
    assert none.server_option(160000) == "none"
    assert none.server_option(150004) is None
    mixed = OriginRules(NONE_POLICY, {"r1": None, "r2": ANY_POLICY})
    assert mixed.server_option(170000) is None
    lists = OriginRules(OriginPolicy("lists", deny=("x",)), {"r1": None})
    assert lists.server_option(170000) is None


# -- transaction metadata ----------------------------------------------------------------------

COLS = (RelationColumn(1, "id", 23, -1), RelationColumn(0, "v", 25, -1))
REL = Relation(100, "public", "t", "d", COLS)


def _txn(n: int, origin: str | None = None):
    a = TransactionAssembler(RelationCache())
    a.feed(1, REL)
    a.feed(2, Begin(900, 7, 42))
    if origin:
        a.feed(3, Origin(0x55, origin))
    for i in range(n):
        a.feed(10 + i, Insert(100, (str(i), f"v{i}")))
    (txn,) = a.feed(99, Commit(0, 900, 950, 7))
    return txn


def test_transaction_meta_begin_end_counts():
    router = ChangeRouter([RouteSpec("a", tables=frozenset({("public", "t")})),
                           RouteSpec("b", all_tables=True, topic="b.all")], db="db",
                          chunk_records=3)
    meta = TransactionMeta("tx", db="db")
    chunks = list(meta.wrap(_txn(4, "node_a"), router.route(_txn(4, "node_a"))))
    records = [r for c in chunks for r in c.records]
    assert [c.last for c in chunks][-1] and len(chunks) >= 3
    assert ("tx", "") in chunks[0].new_topics
    first, last = json.loads(records[0][2]), json.loads(records[-1][2])
    assert first["status"] == "BEGIN" and first["id"] == "42:900"
    assert first["event_count"] is None and first["source"]["origin"] == "node_a"
    assert last["status"] == "END" and last["event_count"] == 8
    assert last["data_collections"] == [{"data_collection": "a.public.t", "event_count": 4},
                                        {"data_collection": "b.all", "event_count": 4}]
    assert json.loads(records[0][1]) == {"id": "42:900"}
    assert records[0][0] == records[-1][0] == "tx"
    # the topic is announced once
    again = list(meta.wrap(_txn(1), router.route(_txn(1))))
    assert all(("tx", "") not in c.new_topics for c in again)


def test_transaction_meta_skips_transactions_without_records():
    router = ChangeRouter([RouteSpec("a", tables=frozenset({("public", "other")}))], db="db")
    meta = TransactionMeta("tx", db="db")
    chunks = list(meta.wrap(_txn(2), router.route(_txn(2))))
    assert [c.records for c in chunks] == [[]] and chunks[-1].last
