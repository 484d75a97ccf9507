"""router.formats.tombstones: a null-value record after each delete of a route with
``tombstones = true`` (and of the old key after a key change), in every format; routes
without tombstones unchanged."""

from __future__ import annotations

import io
import json

import fastavro
import pytest

from router.formats.avro import AvroFormat, SchemasNeeded, split_header
from router.stream.changes import Change, Changes
from router.formats.connect import ConnectFormat
from router.pgoutput import Relation, RelationColumn
from router.routing.change_router import ChangeRouter, RouteSpec
from router.stream.transactions import Transaction
from tests.helpers import config_head

INT4, TEXT = 23, 25
REL = Relation(1, "public", "t", "d", (RelationColumn(1, "id", INT4, -1),
                                       RelationColumn(0, "v", TEXT, -1)))
FULL = Relation(2, "public", "f", "f", (RelationColumn(1, "id", INT4, -1),
                                        RelationColumn(1, "v", TEXT, -1)))

#: FULL's primary key keys its records (its identity flags every column)
PKS = {("public", "f"): ("id",)}


def txn(changes, xid=5):
    return Transaction(xid, 100, 100, 101, 789_000_000_000, None, None, None,
                       Changes(changes, (), None, (), frozenset(), len(changes)), len(changes))


CHANGES = [Change("insert", 1, REL, new=("1", "a")),
           Change("update", 2, REL, new=("1", "b")),  # same key: no old tuple
           Change("update", 3, REL, old=("1", None), old_is_key=True, new=("2", "b")),
           Change("delete", 4, REL, old=("2", None), old_is_key=True),
           Change("insert", 5, FULL, new=("7", "x")),
           Change("update", 6, FULL, old=("7", "x"), new=("7", "y")),  # full identity, same key
           Change("delete", 7, FULL, old=("7", "y"))]


def routed(router, changes, short=False):
    t = txn(changes)
    chunks = [router.route_short(t)] if short else list(router.route(t))
    assert chunks[0] is not None
    return chunks


def shape(records):
    return [(topic, None if k is None else json.loads(k),
             None if v is None else json.loads(v)["op"]) for topic, k, v, _ in records]


@pytest.mark.parametrize("short", [False, True])
def test_deletes_and_key_changes_are_followed_by_tombstones(short):
    router = ChangeRouter([RouteSpec(name="r", all_tables=True, tombstones=True),
                           RouteSpec(name="p", all_tables=True)], db="d", primary_keys=PKS)
    records = [r for c in routed(router, CHANGES, short) for r in c.records]
    got = [r for r in shape(records) if r[0].startswith("r.")]
    assert got == [
        ("r.public.t", {"id": 1}, "c"), ("r.public.t", {"id": 1}, "u"),
        ("r.public.t", {"id": 2}, "u"), ("r.public.t", {"id": 1}, None),  # the old key gone
        ("r.public.t", {"id": 2}, "d"), ("r.public.t", {"id": 2}, None),
        ("r.public.f", {"id": 7}, "c"), ("r.public.f", {"id": 7}, "u"),
        ("r.public.f", {"id": 7}, "d"), ("r.public.f", {"id": 7}, None)]
    plain = [r for r in shape(records) if r[0].startswith("p.")]
    assert [op for _, _, op in plain] == ["c", "u", "u", "d", "c", "u", "d"], \
        "a route without tombstones writes none"


def test_a_filter_turning_an_update_into_a_delete_is_followed_by_a_tombstone():
    def planner(rel):
        return {"update_filter": lambda row: row[1] == "a"}
    router = ChangeRouter([RouteSpec(name="r", planner=planner, tombstones=True)], db="d")
    change = Change("update", 1, REL, old=("1", "a"), old_is_key=False, new=("1", "b"))
    records = next(iter(router.route(txn([change])))).records
    assert shape(records) == [("r.public.t", {"id": 1}, "d"), ("r.public.t", {"id": 1}, None)]


def test_routes_without_tombstones_keep_the_direct_path():
    router = ChangeRouter([RouteSpec(name="p", all_tables=True),
                           RouteSpec(name="q", all_tables=True, tombstones=True)], db="d")
    direct = router._dispatch_for(REL)[4]
    assert direct["insert"] is not None, "inserts of a tombstone route stay direct"
    assert direct["delete"] is None and direct["update"] is None
    alone = ChangeRouter([RouteSpec(name="p", all_tables=True)], db="d")._dispatch_for(REL)[4]
    assert all(v is not None for v in alone.values())


def _avro(records, schemas, python: bool):
    fmt, texts, ids = AvroFormat(), {}, {}
    for s in schemas:
        fmt.learn(s)
    convert = fmt._convert_all_py if python else fmt.convert_all
    try:
        return convert(records), texts
    except SchemasNeeded as need:
        for s in need.subjects:
            sid = ids.setdefault((s.subject, s.schema), len(ids) + 1)
            texts[sid] = s.schema
            fmt.set_id(s, sid)
    return convert(records), texts


def _read(data, texts):
    sid, body = split_header(data)
    return fastavro.schemaless_reader(io.BytesIO(body),
                                      fastavro.parse_schema(json.loads(texts[sid])))


@pytest.mark.parametrize("python", [False, True])
def test_avro_tombstones_have_the_avro_key_and_a_null_value(python):
    router = ChangeRouter([RouteSpec(name="r", all_tables=True, tombstones=True)], db="d",
                          primary_keys=PKS)
    chunk = routed(router, CHANGES)[0]
    out, texts = _avro(chunk.records, chunk.schemas, python)
    got = [(r[0], _read(r[1], texts), None if r[2] is None else _read(r[2], texts)["op"])
           for r in out]
    assert got == [
        ("r.public.t", {"id": 1}, "c"), ("r.public.t", {"id": 1}, "u"),
        # the key change: a delete and a create (as Debezium), then the old key's tombstone
        ("r.public.t", {"id": 1}, "d"), ("r.public.t", {"id": 2}, "c"),
        ("r.public.t", {"id": 1}, None),
        ("r.public.t", {"id": 2}, "d"), ("r.public.t", {"id": 2}, None),
        ("r.public.f", {"id": 7}, "c"), ("r.public.f", {"id": 7}, "u"),
        ("r.public.f", {"id": 7}, "d"), ("r.public.f", {"id": 7}, None)]
    tombstone = out[-1]
    assert tombstone[1] == out[-2][1], "the same key bytes as its delete: same partition"


def test_connect_tombstones_have_the_connect_key_and_a_null_value():
    router = ChangeRouter([RouteSpec(name="r", all_tables=True, tombstones=True)], db="d",
                          primary_keys=PKS)
    chunk = routed(router, CHANGES)[0]
    fmt = ConnectFormat()
    for s in chunk.schemas:
        fmt.learn(s)
    out = fmt.convert_all(chunk.records)
    got = [(json.loads(k)["payload"], None if v is None else json.loads(v)["payload"]["op"])
           for _, k, v, _ in out]
    assert got == [({"id": 1}, "c"), ({"id": 1}, "u"), ({"id": 1}, "d"), ({"id": 2}, "c"),
                   ({"id": 1}, None), ({"id": 2}, "d"), ({"id": 2}, None),
                   ({"id": 7}, "c"), ({"id": 7}, "u"), ({"id": 7}, "d"), ({"id": 7}, None)]
    assert out[-1][1] == out[-2][1]
    assert json.loads(out[-1][1])["schema"]["name"].endswith("Key")


def test_repair_deletes_and_filtered_out_repair_rows_are_followed_by_tombstones():
    from router.formats.envelope import TxContext
    from router.snapshot.rows import SnapshotRows

    def planner(rel):
        return {"insert_filter": lambda row: row[1] == "keep"}
    rows = SnapshotRows(ChangeRouter([RouteSpec(name="r", all_tables=True, tombstones=True),
                                      RouteSpec(name="f", planner=planner, tombstones=True),
                                      RouteSpec(name="p", all_tables=True)], db="d"))
    tx = TxContext(xid=0, commit_lsn=99, end_lsn=100, commit_time=0)
    gone = rows.deletes(REL, [("9",)], (0,), tx, 5).records
    assert shape(gone) == [("r.public.t", {"id": 9}, "d"), ("r.public.t", {"id": 9}, None),
                           ("f.public.t", {"id": 9}, "d"), ("f.public.t", {"id": 9}, None),
                           ("p.public.t", {"id": 9}, "d")]
    # a repaired row the filter rejects is a delete of its key on that route
    read = rows.chunk(REL, [("4", "drop")], tx, 7, repair=True).records
    assert shape(read) == [("r.public.t", {"id": 4}, "r"), ("f.public.t", {"id": 4}, "d"),
                           ("f.public.t", {"id": 4}, None), ("p.public.t", {"id": 4}, "r")]


def test_the_applier_releases_a_transaction_with_tombstones():
    """END counts change events, not tombstones: the applier's reassembler (which skips
    tombstones) releases the transaction instead of waiting for them for ever."""
    from router.apply.reassembly import Reassembler
    from router.routing.transaction_meta import TransactionMeta

    router = ChangeRouter([RouteSpec(name="r", all_tables=True, tombstones=True)], db="d")
    t = txn(CHANGES[:4])
    records = [r for c in TransactionMeta("tx", db="d").wrap(t, router.route(t))
               for r in c.records]
    assert sum(r[2] is None for r in records) == 2
    ra = Reassembler(lambda topic: True, transactions_topic="tx")
    for offset, (topic, _, value, _) in enumerate(records):
        if topic == "tx":
            ra.add_transaction_record(value, offset)
        else:
            ra.add_record(topic, value, 0, offset)
    [released] = list(ra.ready())
    assert [rec.op for _, rec in released.records] == ["c", "u", "u", "d"]


@pytest.mark.parametrize("fmt, ops, policy, refused", [
    ("avro", None, "compact", True), ("connect", None, "delete,compact", True),
    ("json", None, "compact", False), ("avro", '["insert", "update", "delete"]', "compact",
                                       False),
    ("avro", None, "delete", False)])
def test_a_compacted_topic_refusing_truncate_records_is_a_config_error(fmt, ops, policy,
                                                                       refused):
    """Avro's and Connect's TRUNCATE record has a null Kafka key, which a compacted topic
    refuses (INVALID_RECORD at every start): refused when the config is loaded."""
    from router.config.router import parse_config
    from router.errors import ConfigError

    text = config_head("postgresql://u@h/d") + f"""format = "{fmt}"
[kafka.registry]
url = "http://r"
[[routes]]
name = "r"
all_tables = true
{f"operations = {ops}" if ops else ""}
topic_settings = {{ configs = {{ "cleanup.policy" = "{policy}" }} }}
"""
    if refused:
        with pytest.raises(ConfigError, match=r"routes\[0\].operations: a TRUNCATE record has "
                                              "a null key"):
            parse_config(text)
    else:
        parse_config(text)
