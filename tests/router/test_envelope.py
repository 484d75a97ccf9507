"""The record bytes: the templated/Struct encoder (``TableEncoder``) and the router's direct
path give exactly the bytes of the envelope built as dicts, as documented in
``router/formats/envelope.py`` — over many random rows, types, names and operations."""

from __future__ import annotations

import base64
import json
import random

import msgspec
import pytest

from router.stream.changes import Change
from router.formats.envelope import TableEncoder, TxContext
from router.pgoutput import UNCHANGED_TOAST, Relation, RelationColumn
from router.pgoutput.timestamps import pg_time_to_iso, pg_time_to_unix_ms
from router.routing.plans import apply_plan
from router.routing.change_router import ChangeRouter, RouteSpec

BOOL, INT2, INT4, INT8, OID, FLOAT4, FLOAT8, TEXT, NUMERIC, BYTEA = (
    16, 21, 23, 20, 26, 700, 701, 25, 1700, 17)
U = UNCHANGED_TOAST
_encode = msgspec.json.encode


def _float(text):
    return text if text in ("NaN", "Infinity", "-Infinity") else float(text)


_CONV = {INT2: int, INT4: int, INT8: int, OID: int, FLOAT4: _float, FLOAT8: _float,
         BOOL: lambda t: t == "t"}


def ref_value(oid, v):
    if v is None:
        return None
    if type(v) is bytes:
        return "\\x" + v.hex()
    c = _CONV.get(oid)
    return v if c is None else c(v)


def ref_row(rel, pick, values, skip_nulls):
    out, toast = {}, []
    for i in pick:
        col, v = rel.columns[i], values[i]
        if v is None and skip_nulls:
            continue
        if v is U:
            toast.append(col.name)
            continue
        out[col.name] = ref_value(col.type_oid, v)
    return out, toast or None


def ref_encode(rel, pick, route, db, op, tx, lsn, seq, old, old_is_key, new):
    """The envelope as the README documents it, built as dicts."""
    before = after = toast = None
    if old is not None:
        before, _ = ref_row(rel, pick, old, old_is_key)
    if new is not None:
        after, toast = ref_row(rel, pick, new, False)
    source = {"db": db, "schema": rel.namespace, "table": rel.name, "lsn": lsn,
              "commit_lsn": tx.commit_lsn, "seq": seq, "xid": tx.xid,
              "commit_time": pg_time_to_iso(tx.commit_time), "origin": tx.origin,
              "origin_lsn": tx.origin_lsn, "route": route,
              "schema_id": TableEncoder(rel, route=route, db=db,
                                        column_indexes=None if pick is None else tuple(pick)
                                        ).schema.schema_id}
    value = {"op": op, "before": before, "after": after, "source": source,
             "ts_ms": pg_time_to_unix_ms(tx.commit_time)}
    if toast:
        value["unchanged_toast"] = toast
    keyrow = new if new is not None else old
    keys = [i for i, c in enumerate(rel.columns) if c.flags & 1]
    key = b"null" if not keys or keyrow is None else _encode(
        {rel.columns[i].name: ref_value(rel.columns[i].type_oid, keyrow[i]) for i in keys})
    return key, _encode(value)


_TEXTS = ["", "a", "%", "%d%s%b", 'quote " and \\ back', "tab\tnew\nline", "\x00\x01\x05",
          "ünïcödé ✓ 𝄞", "payment for order 00000001", "  spaced  ", "null", "{}"]


def rand_value(rng, oid, toast_ok):
    r = rng.random()
    if r < 0.12:
        return None
    if toast_ok and r < 0.2:
        return U
    if oid in (INT2, INT4, INT8, OID):
        return str(rng.choice([0, 1, -1, 7, 2**31 - 1, -2**63, 2**63 - 1, rng.randint(-10**6, 10**6)])
                   if oid != OID else rng.randint(0, 2**32 - 1))
    if oid in (FLOAT4, FLOAT8):
        return rng.choice(["NaN", "Infinity", "-Infinity", "0", "-0", "1.5", "1e+20", "3.14159",
                           "1.7976931348623157e+308", "5e-324", repr(rng.random())])
    if oid == BOOL:
        return rng.choice("tf")
    if oid == NUMERIC:
        return rng.choice(["1.25", "NaN", "-0.001", "123456789012345678901234567890.5"])
    if oid == BYTEA and rng.random() < 0.5:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(6)))
    return rng.choice(_TEXTS) + str(rng.randrange(100))


def rand_relation(rng, relid):
    oids = [BOOL, INT2, INT4, INT8, OID, FLOAT4, FLOAT8, TEXT, NUMERIC, BYTEA]
    names = ["id", "v", "%s", 'q"uote', "ünï", "a b", "c0", "__init__", "class", "x\ny"]
    n = rng.randint(1, 7)
    cols = tuple(RelationColumn(1 if i < rng.randint(0, 2) else 0, names[(i + relid) % len(names)]
                                + str(i), rng.choice(oids), -1) for i in range(n))
    return Relation(relid, rng.choice(["public", "s%d"]), rng.choice(["t", "T 1", "x%"]),
                    rng.choice("dfin"), cols)


def rand_change(rng, rel):
    """``(op, old, old_is_key, new)`` of a generated change of ``rel``."""
    op = rng.choice("cudr")
    new = old = None
    old_is_key = False
    if op in "cur":
        new = tuple(rand_value(rng, c.type_oid, op == "u" and not c.flags & 1)
                    for c in rel.columns)
    if op in "ud" and rng.random() < 0.7:
        old_is_key = rng.random() < 0.5
        old = tuple(rand_value(rng, c.type_oid, False) if (c.flags & 1 or not old_is_key)
                    else None for c in rel.columns)
    if op == "d" and old is None:
        old = tuple(rand_value(rng, c.type_oid, False) for c in rel.columns)
    return op, old, old_is_key, new


def test_encoder_bytes_equal_the_dict_envelope():
    rng = random.Random(20261122)
    checked = 0
    for relid in range(60):
        rel = rand_relation(rng, relid)
        n = len(rel.columns)
        pick = None if rng.random() < 0.6 else sorted(rng.sample(range(n), rng.randint(1, n)))
        route, db = rng.choice([("r", "postgres"), ("r%d", "db%s"), ('r"1', "ü")])
        enc = TableEncoder(rel, route=route, db=db,
                           column_indexes=None if pick is None else tuple(pick))
        cols = list(range(n)) if pick is None else pick
        for t in range(3):
            tx = TxContext(xid=rng.randint(1, 2**32 - 1), commit_lsn=rng.randint(0, 2**64 - 1),
                           end_lsn=0, commit_time=rng.randint(-10**15, 10**16),
                           origin=rng.choice([None, "node%s"]),
                           origin_lsn=rng.choice([None, 5, 2**64 - 1]))
            for seq in range(40):
                op, old, old_is_key, new = rand_change(rng, rel)
                lsn = rng.randint(0, 2**64 - 1)
                got = enc.encode(op, tx, lsn, seq, old=old, old_is_key=old_is_key, new=new)
                want = ref_encode(rel, cols, route, db, op, tx, lsn, seq, old, old_is_key, new)
                assert got == want, (rel, op, old, new)
                json.loads(got[1])
                checked += 1
    assert checked == 60 * 3 * 40


def test_plain_rows_with_many_columns_and_no_struct_fallback():
    cols = tuple(RelationColumn(1 if i == 0 else 0, f"c{i}", INT4 if i % 2 else TEXT, -1)
                 for i in range(300))
    rel = Relation(1, "public", "wide", "d", cols)
    enc = TableEncoder(rel, route="r", db="d")
    tx = TxContext(xid=1, commit_lsn=10, end_lsn=20, commit_time=0)
    row = tuple(str(i) if i % 7 else None for i in range(300))
    assert enc.encode("c", tx, 5, 0, old=None, old_is_key=False, new=row) == ref_encode(
        rel, range(300), "r", "d", "c", tx, 5, 0, None, False, row)


class _Txn:
    first_seq, partial = 0, False  # a whole transaction (Transaction's fields)

    def __init__(self, changes):
        self.changes, self.xid, self.commit_lsn, self.end_lsn = changes, 7, 900, 950
        self.commit_time, self.origin_name, self.origin_lsn = 123_456_789, None, None


@pytest.mark.parametrize("position_headers", [False, True])
def test_router_direct_path_equals_plan_by_plan_evaluation(position_headers):
    """Routes without filters or row maps take the router's direct path; its records (topic,
    key, value, headers) and schemas must be what evaluating every plan gives."""
    rng = random.Random(7)
    rels = [rand_relation(rng, r) for r in range(1, 6)]
    changes = []
    for i in range(400):
        rel = rng.choice(rels)
        op = rng.choice(["insert", "update", "delete"])
        row = tuple(rand_value(rng, c.type_oid, op == "update" and not c.flags & 1)
                    for c in rel.columns)
        old = tuple(rand_value(rng, c.type_oid, False) for c in rel.columns)
        if op == "insert":
            changes.append(Change("insert", i, rel, new=row))
        elif op == "update":
            changes.append(Change("update", i, rel, old=rng.choice([None, old]),
                                  old_is_key=rng.random() < 0.3, new=row))
        else:
            changes.append(Change("delete", i, rel, old=old, old_is_key=rng.random() < 0.5))
    routes = [RouteSpec("all", all_tables=True),
              RouteSpec("ins", all_tables=True, operations=frozenset({"insert"})),
              RouteSpec("some", tables=frozenset({("public", "t"), ("s%d", "x%")}))]
    router = ChangeRouter(routes, db="d", chunk_records=97, position_headers=position_headers)
    got, got_schemas = [], []
    chunks = list(router.route(_Txn(changes)))
    for c in chunks:
        got += c.records
        got_schemas += [s.schema_id for s in c.schemas]
    assert [c.last for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert all(len(c.records) <= 97 + 2 for c in chunks)

    ref = ChangeRouter(routes, db="d")
    tx = TxContext(xid=7, commit_lsn=900, end_lsn=950, commit_time=123_456_789)
    want, want_schemas = [], []
    for seq, change in enumerate(changes):
        for plan in ref.plans_for(change.relation):
            r = apply_plan(plan, change)
            if r is None:
                continue
            kind, old, old_is_key, new = r
            enc = plan.encoder
            if enc.schema.schema_id not in want_schemas:
                want_schemas.append(enc.schema.schema_id)
            key, value = ref_encode(enc.relation, range(len(enc.relation.columns)), plan.route,
                                    "d", kind, tx, change.lsn, seq, old, old_is_key, new)
            want.append((plan.topic, key, value,
                         [("pgrouter.commit_lsn", b"900"), ("pgrouter.seq", str(seq).encode())]
                         if position_headers else None))
    assert got == want and len(want) > 400
    assert got_schemas == want_schemas


def test_message_content_is_base64():
    from router.formats.envelope import encode_message

    _, value = encode_message(db="d", route="", tx=None, lsn=1, seq=0, transactional=False,
                              prefix="p", content=b"\x00\xff")
    assert json.loads(value)["message"]["content"] == base64.b64encode(b"\x00\xff").decode()


def test_unchanged_toasted_key_is_taken_from_the_old_key_tuple():
    from router.formats.envelope import TableEncoder, TxContext
    from router.pgoutput import UNCHANGED_TOAST, Relation, RelationColumn

    rel = Relation(relation_id=1, namespace="public", name="t", replica_identity="d",
                   columns=(RelationColumn(1, "k", 25, -1), RelationColumn(0, "v", 25, -1)))
    enc = TableEncoder(rel, route="r", db="d")
    tx = TxContext(xid=1, commit_lsn=10, end_lsn=20, commit_time=0)
    big = "x" * 5000
    key, value = enc.encode("u", tx, 5, 0, old=(big, None), old_is_key=True,
                            new=(UNCHANGED_TOAST, "new"))
    assert key == b'{"k":"' + big.encode() + b'"}'
    assert b'"unchanged_toast":["k"]' in value
    key, _ = enc.encode("u", tx, 5, 1, old=None, old_is_key=False, new=(UNCHANGED_TOAST, "v"))
    assert key == b'{"k":null}', "no old key tuple: the value is unknown, never a crash"
