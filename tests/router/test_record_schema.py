"""Every encoder's records follow the declared envelope (``router.formats.record_schema``): the
table encoder (its Python and C paths, plans with column lists), snapshot rows, truncates,
logical messages and the Kafka Connect form, over generated rows of every value kind."""

from __future__ import annotations

import json
import random

import msgspec
import pytest

from router.formats.connect import ConnectFormat
from router.formats.envelope import TableEncoder, TxContext, encode_message
from router.formats.record_schema import RecordSchemaError, validate, validate_connect
from router.routing.change_router import ChangeRouter, RouteSpec
from router.snapshot.rows import SnapshotRows
from tests.router.test_envelope import rand_change, rand_relation, rand_value


def _records(seed: int):
    """(encoder, value bytes) for generated changes of generated tables."""
    rng = random.Random(seed)
    for relid in range(40):
        rel = rand_relation(rng, relid)
        n = len(rel.columns)
        pick = None if rng.random() < 0.6 else tuple(sorted(rng.sample(range(n),
                                                                       rng.randint(1, n))))
        enc = TableEncoder(rel, route="r", db="d", column_indexes=pick)
        tx = TxContext(xid=rng.randint(1, 2**32 - 1), commit_lsn=rng.randint(0, 2**63),
                       end_lsn=0, commit_time=rng.randint(0, 10**16),
                       origin=rng.choice([None, "node"]), origin_lsn=rng.choice([None, 5]))
        for seq in range(30):
            op, old, old_is_key, new = rand_change(rng, rel)
            yield enc, enc.encode(op, tx, 100 + seq, seq, old=old, old_is_key=old_is_key,
                                  new=new)[1]
        yield enc, enc.encode_truncate(tx, 999, 30, rng.randrange(4))[1]


def test_table_encoder_records_follow_the_schema():
    ops = set()
    for _, value in _records(20261125):
        env = validate(value)
        ops.add(env.op)
        if env.unchanged_toast:
            assert not set(env.unchanged_toast) & set(env.after)
    assert ops == {"c", "u", "d", "r", "t"}


def test_logical_messages_follow_the_schema():
    tx = TxContext(xid=7, commit_lsn=90, end_lsn=95, commit_time=0)
    for t, transactional in ((tx, True), (None, False)):
        _, value = encode_message(db="d", route="r", tx=t, lsn=80, seq=0,
                                  transactional=transactional, prefix="p", content=b"\x00x")
        assert validate(value).message.prefix == "p"


def test_snapshot_rows_follow_the_schema():
    rng = random.Random(7)
    rel = rand_relation(rng, 3)
    rows = SnapshotRows(ChangeRouter([RouteSpec(name="all", all_tables=True)], db="d"),
                        position_headers=False)
    tx = TxContext(xid=0, commit_lsn=5, end_lsn=9, commit_time=0)
    data = [tuple(rand_value(rng, c.type_oid, False) for c in rel.columns) for _ in range(50)]
    chunk = rows.chunk(rel, data, tx, 0)
    assert len(chunk.records) == 50
    for _, _, value, _ in chunk.records:
        assert validate(value).op == "r"


def test_connect_records_follow_the_schema():
    fmt = ConnectFormat()
    checked = 0
    for enc, value in _records(11):
        fmt.learn(enc.schema)
        key = b'{"x": 1}'
        try:
            out = fmt.convert(("topic", key, value, None))
        except Exception as exc:  # noqa: BLE001 — values Connect has no form for
            assert type(exc).__name__ == "RecordUnencodable", exc
            continue
        for _, _, converted, _ in (out if type(out) is list else [out]):
            assert validate_connect(converted).payload.op in "cudrt"
            checked += 1
    assert checked > 500


@pytest.mark.parametrize("change, rule", [
    (lambda v: v.update(op="x"), "op"),
    (lambda v: v.update(before={"id": 1}), "no `before`"),
    (lambda v: v.update(after=None), "carries `after`"),
    (lambda v: v.update(extra=1), "extra"),
    (lambda v: v["source"].pop("lsn"), "lsn"),
    (lambda v: v.update(unchanged_toast=["id"]), "left out"),
    (lambda v: v.update(unchanged_toast=[]), "empty"),
    (lambda v: v.update(truncate={"cascade": True, "restart_identity": False}), "truncate"),
    (lambda v: v["after"].update(id=[1]), "after"),
])
def test_a_value_breaking_the_schema_is_refused_with_the_rule(change, rule):
    value = {"op": "c", "before": None, "after": {"id": 1}, "ts_ms": 1,
             "source": {"db": "d", "schema": "s", "table": "t", "lsn": 1, "commit_lsn": 2,
                        "seq": 0, "xid": 3, "commit_time": None, "origin": None,
                        "origin_lsn": None, "route": "r", "schema_id": "abc"}}
    validate(json.dumps(value).encode())
    change(value)
    with pytest.raises(RecordSchemaError, match=rule):
        validate(msgspec.json.encode(value))
