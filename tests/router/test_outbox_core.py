"""router.routing.outbox: an outbox table's inserts as events in the Outbox Event Router's shape;
updates and deletes publish nothing; a route beside it sees the table as usual."""

from __future__ import annotations

import json

import pytest

from router.stream.changes import Change, Changes
from router.config.router import parse_config
from router.errors import ConfigError
from router.routing.outbox import OutboxConfig
from router.pgoutput import Relation, RelationColumn
from router.routing.change_router import ChangeRouter, RouteSpec
from router.stream.transactions import Transaction
from tests.helpers import config_head

UUID, TEXT, JSONB = 2950, 25, 3802
OUTBOX = Relation(1, "public", "outbox", "d", (RelationColumn(1, "id", UUID, -1),
                                               RelationColumn(0, "aggregatetype", TEXT, -1),
                                               RelationColumn(0, "aggregateid", TEXT, -1),
                                               RelationColumn(0, "type", TEXT, -1),
                                               RelationColumn(0, "payload", JSONB, -1)))
CFG = OutboxConfig(topic="{route}.{aggregatetype}.events", headers=["type"])
ID = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"


def txn(changes):
    return Transaction(5, 100, 100, 101, 789_000_000_000, None, None, None,
                       Changes(changes, (), None, (), frozenset(), len(changes)), len(changes))


def router(**kw):
    return ChangeRouter([RouteSpec(name="ev", all_tables=True, outbox=CFG,
                                   operations=frozenset({"insert"})),
                         RouteSpec(name="cdc", all_tables=True)], db="d", **kw)


ROW = (ID, "Order", "o-17", "OrderCreated", '{"total": 3}')


@pytest.mark.parametrize("short", [False, True])
def test_an_insert_is_an_event_and_its_delete_nothing(short):
    r = router()
    t = txn([Change("insert", 1, OUTBOX, new=ROW),
             Change("delete", 2, OUTBOX, old=(ID, None, None, None, None), old_is_key=True),
             Change("insert", 3, OUTBOX, new=(ID[:-1] + "9", "a.b", None, "X", None)),
             Change("insert", 4, OUTBOX, new=(ID, "purchase-order é", "p", "X", "{}"))])
    chunks = [r.route_short(t)] if short else list(r.route(t))
    records = [rec for c in chunks for rec in c.records]
    events = [rec for rec in records if not rec[0].startswith("cdc.")]
    assert events == [
        ("ev.Order.events", b"o-17", b'{"total": 3}', [("id", ID.encode()),
                                                       ("type", b"OrderCreated")]),
        ("ev.a.b.events", None, None, [("id", (ID[:-1] + "9").encode()), ("type", b"X")]),
        # Debezium's topic for what Kafka takes (its RegexRouter puts the value as it is);
        # the characters Kafka refuses escaped
        ("ev.purchase-order-20-c3-a9.events", b"p", b"{}", [("id", ID.encode()),
                                                             ("type", b"X")])]
    # the other route takes the table as any other: c, d, c envelopes
    assert [json.loads(rec[2])["op"] for rec in records if rec[0].startswith("cdc.")] == [
        "c", "d", "c", "c"]
    topics = {t for c in chunks for t, _ in c.new_topics}
    assert {"ev.Order.events", "ev.a.b.events"} <= topics
    assert all(s.table == "outbox" for c in chunks for s in c.schemas)


def test_position_headers_follow_the_events_own():
    r = router(position_headers=True)
    [chunk] = r.route(txn([Change("insert", 1, OUTBOX, new=ROW)]))
    assert chunk.records[0][3] == [("id", ID.encode()), ("type", b"OrderCreated"),
                                   ("pgrouter.commit_lsn", b"100"), ("pgrouter.seq", b"0")]


def test_a_missing_column_is_named():
    r = ChangeRouter([RouteSpec(name="ev", all_tables=True, outbox=OutboxConfig(
        key="aggregate_id"))], db="d")
    with pytest.raises(ConfigError, match="no column 'aggregate_id' \\(key\\)"):
        r.plans_for(OUTBOX)


def _config(route: str, fmt: str = "json") -> str:
    return config_head("postgresql://u@h/d") + f"""format = "{fmt}"
[kafka.registry]
url = "http://r"
[[routes]]
name = "ev"
{route}
"""


@pytest.mark.parametrize("route, fmt, problem", [
    ('all_tables = true\n[routes.outbox]\n', "json", "names its outbox table"),
    ('tables = ["public.outbox"]\n[routes.outbox]\n', "avro", 'format = "json"'),
    ('tables = ["public.outbox"]\ntombstones = true\n[routes.outbox]\n', "json", "tombstones"),
    ('tables = ["public.outbox"]\n[routes.outbox]\ntopic = "events"\n', "json", "names a column"),
    ('tables = ["public.outbox"]\n[routes.outbox]\ndead_letter = "a b"\n', "json",
     "dead_letter: topic .* Kafka does not allow"),
    # a conversion or a format spec: quoted or padded values, every row's topic refused
    ('tables = ["public.outbox"]\n[routes.outbox]\ntopic = "e.{aggregatetype!r}"\n', "json",
     "column's name only"),
    ('tables = ["public.outbox"]\n[routes.outbox]\ntopic = "e.{aggregatetype:>9}"\n', "json",
     "column's name only"),
])
def test_outbox_config_is_checked(route, fmt, problem):
    with pytest.raises(ConfigError, match=problem):
        parse_config(_config(route, fmt))


def test_outbox_defaults_are_debeziums():
    cfg = parse_config(_config('tables = ["public.outbox"]\n[routes.outbox]\n'))
    out = cfg.routes[0].outbox
    assert (out.topic, out.key, out.payload, out.id) == (
        "outbox.event.{aggregatetype}", "aggregateid", "payload", "id")


def test_remembered_topics_stay_each_values_own(monkeypatch):
    """The topic of each distinct value is remembered (router.routing.outbox ``TOPICS_KEPT``, then
    forgotten at once): a value seen again, after others and after the forgetting, gets its
    own topic; one that makes a topic Kafka refuses is refused every time."""
    import router.routing.outbox as outbox

    monkeypatch.setattr(outbox, "TOPICS_KEPT", 2)
    plan = outbox.OutboxPlan(OutboxConfig(), OUTBOX, "ev")
    kinds = ["Order", "a b", "Order", "purchase-order", "x", "a b", "Order"]
    assert [plan.record((ID, k, "1", "T", "{}"), None)[0] for k in kinds] == [
        "outbox.event.Order", "outbox.event.a-20b", "outbox.event.Order",
        "outbox.event.purchase-order", "outbox.event.x", "outbox.event.a-20b",
        "outbox.event.Order"]
    assert len(plan._topics) <= 2
    for _ in range(2):
        with pytest.raises(outbox.Poison, match="makes topic"):
            plan.record((ID, "y" * 300, "1", "T", "{}"), None)


def test_a_null_topic_column_names_no_topic():
    """A NULL in a column of the topic template names no topic: one line naming the column
    and the event id (it went to ``outbox.event.``, a topic no consumer reads), every time."""
    import router.routing.outbox as outbox

    plan = outbox.OutboxPlan(OutboxConfig(), OUTBOX, "ev")
    for _ in range(2):
        with pytest.raises(outbox.Poison, match="names no topic: its column aggregatetype is NULL"):
            plan.record((ID, None, "1", "T", "{}"), None)
    two = outbox.OutboxPlan(OutboxConfig(topic="{type}.{aggregatetype}"), OUTBOX, "ev")
    with pytest.raises(outbox.Poison, match="column type is NULL"):
        two.record((ID, "Order", "1", None, "{}"), None)


TEXT_OUTBOX = Relation(1, "public", "outbox", "d", OUTBOX.columns[:4]
                       + (RelationColumn(0, "payload", TEXT, -1),))


@pytest.mark.parametrize("short", [False, True])
def test_a_row_that_makes_no_event_stops_the_router_in_one_line(short):
    """Without a dead-letter topic a row that makes no event (a NULL topic column, a text
    payload that is not JSON) is one ConfigError naming route, table, id, key and LSN."""
    r = ChangeRouter([RouteSpec(name="ev", all_tables=True, outbox=OutboxConfig())], db="d")
    for row, why in (((ID, None, "o-1", "T", "{}"), "its column aggregatetype is NULL"),
                     ((ID, "Order", "o-1", "T", "{\"a\": 1"), "its payload is not JSON")):
        t = txn([Change("insert", 0x16B3748, TEXT_OUTBOX, new=row)])
        with pytest.raises(ConfigError) as err:
            [r.route_short(t)] if short else list(r.route(t))
        assert (f"route 'ev': the outbox row of id {ID} (table public.outbox, key 'o-1', "
                f"LSN 0/16B3748) ") in str(err.value) and why in str(err.value)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("short", [False, True])
def test_a_dead_letter_topic_takes_the_rows_that_make_no_event(short):
    """With ``dead_letter`` such rows go there in their place (the reason and the table in
    headers) and the events around them go on."""
    cfg = OutboxConfig(dead_letter="ev.dead", headers=["type"])
    r = ChangeRouter([RouteSpec(name="ev", all_tables=True, outbox=cfg)], db="d",
                     position_headers=True)
    t = txn([Change("insert", 1, TEXT_OUTBOX, new=(ID, "Order", "o-1", "T", "{}")),
             Change("insert", 2, TEXT_OUTBOX, new=(ID, None, "o-2", "T", "{}")),
             Change("insert", 3, TEXT_OUTBOX, new=(ID, "Order", "o-3", "T", "not json")),
             Change("insert", 4, TEXT_OUTBOX, new=(ID, "y" * 300, None, "T", None)),
             Change("insert", 5, TEXT_OUTBOX, new=(ID, "Order", "o-5", "T", '"a string"'))])
    chunks = [r.route_short(t)] if short else list(r.route(t))
    records = [rec for c in chunks for rec in c.records]
    assert [(rec[0], rec[1], rec[2]) for rec in records] == [
        ("outbox.event.Order", b"o-1", b"{}"), ("ev.dead", b"o-2", b"{}"),
        ("ev.dead", b"o-3", b"not json"), ("ev.dead", None, None),
        ("outbox.event.Order", b"o-5", b'"a string"')]
    heads = [dict(rec[3]) for rec in records]
    assert heads[1]["pgrouter.error"] == b"names no topic: its column aggregatetype is NULL"
    assert heads[2]["pgrouter.error"].startswith(b"its payload is not JSON (")
    assert b"is 313 characters long" in heads[3]["pgrouter.error"]
    assert all(h["pgrouter.table"] == b"public.outbox" and h["id"] == ID.encode()
               and h["type"] == b"T" for h in heads[1:4])
    assert [h["pgrouter.seq"] for h in heads] == [b"0", b"1", b"2", b"3", b"4"]
    assert ("ev.dead", "ev") in {nt for c in chunks for nt in c.new_topics}


@pytest.mark.parametrize("short", [False, True])
def test_a_topic_differing_only_in_dot_and_underscore_is_a_dead_row(short):
    """Kafka refuses a topic whose '.'-as-'_' name another holds: one it held at the start
    (``topic_folds``) or one of this router's; such a row makes no event."""
    from router.routing.topics import TopicFolds
    cfg = OutboxConfig(dead_letter="ev.dead")
    r = ChangeRouter([RouteSpec(name="ev", all_tables=True, outbox=cfg)], db="d",
                     topic_folds=TopicFolds(["outbox.event.x_y", "outbox.event.p.q"]))
    t = txn([Change("insert", 1, TEXT_OUTBOX, new=(ID, "a_b", "o-1", "T", "{}")),
             Change("insert", 2, TEXT_OUTBOX, new=(ID, "a.b", "o-2", "T", "{}")),
             Change("insert", 3, TEXT_OUTBOX, new=(ID, "x.y", "o-3", "T", "{}")),
             Change("insert", 4, TEXT_OUTBOX, new=(ID, "p.q", "o-4", "T", "{}")),
             Change("insert", 5, TEXT_OUTBOX, new=(ID, "a_b", "o-5", "T", "{}"))])
    chunks = [r.route_short(t)] if short else list(r.route(t))
    records = [rec for c in chunks for rec in c.records]
    assert [rec[0] for rec in records] == ["outbox.event.a_b", "ev.dead", "ev.dead",
                                           "outbox.event.p.q", "outbox.event.a_b"]
    assert dict(records[1][3])["pgrouter.error"] == (
        b"makes topic 'outbox.event.a.b', which Kafka refuses to create beside its topic "
        b"'outbox.event.a_b' (they differ only in '.' and '_')")
    assert b"'outbox.event.x_y'" in dict(records[2][3])["pgrouter.error"]
    assert "outbox.event.a.b" not in {t for c in chunks for t, _ in c.new_topics}


def test_a_bytea_payload_is_its_bytes():
    """A ``bytea`` payload is published as its bytes (what the application wrote, as
    Debezium's BinaryDataConverter writes it), not PostgreSQL's ``\\x`` hex text of them;
    in hex and escape output alike."""
    import router.routing.outbox as outbox

    cols = OUTBOX.columns[:4] + (RelationColumn(0, "payload", 17, -1),)
    plan = outbox.OutboxPlan(OutboxConfig(), Relation(1, "public", "outbox", "d", cols), "ev")
    assert plan.record((ID, "Order", "1", "T", "\\x00ff41"), None)[2] == b"\x00\xffA"
    assert plan.record((ID, "Order", "1", "T", "\\000\\377A"), None)[2] == b"\x00\xffA"
    assert plan.record((ID, "Order", "1", "T", None), None)[2] is None
    # a text payload stays its UTF-8 text, even when it reads like hex
    assert outbox.OutboxPlan(OutboxConfig(), OUTBOX, "ev").record(
        (ID, "Order", "1", "T", "\\x41"), None)[2] == b"\\x41"
