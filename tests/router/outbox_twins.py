"""The lane of ``router._native.OutboxRecorder`` (an outbox route's events in C) against
``router.routing.outbox:PyOutboxRecorder`` for ``tests/router/test_native_twins.py``: the same
record (topic, key, value, headers) for plain rows — text values, NULLs, multibyte text,
headers, position headers or none — and the fallback's record, called with the same
arguments, for the rest (a topic not remembered, a NULL topic column, a non-str value, a
lone surrogate, a short row). C's records and headers are untracked by the collector."""

from __future__ import annotations

import gc

SAME, DECLINED = "same", "declined"
_TOPICS = {"Order": "outbox.event.Order", "é€": "outbox.event.-c3-a9-e2-82-ac"}
_LSN = ("pgrouter.commit_lsn", b"4242")
_VALUES = ["Order", "é€", "o-17", '{"a": 1}', "", None, "x" * 300, "\U0001f600"]
_ODD = [b"\x00", 7, "\ud800", "Unknown"]


def _run(make, case):
    topics, one, key, payload, id_, headers, lsn_header, seq_name, args = case
    calls: list = []

    def fallback(*a):
        calls.append(a)
        return ("fallback", a[2])
    record = make(dict(topics), one, key, payload, id_, headers, lsn_header, seq_name,
                  fallback)(*args)
    return record, calls


def check_outbox_recorder(python, fast, case):
    got, got_calls = _run(fast, case)
    ref, ref_calls = _run(python, case)
    assert got == ref and got_calls == ref_calls, case
    if got_calls:
        return DECLINED
    assert not gc.is_tracked(got) and not gc.is_tracked(got[3]), case
    assert not any(gc.is_tracked(h) for h in got[3]), case
    return SAME


def _case(row, lsn_header=_LSN, headers=(("type", 3),), seq=5):
    return (_TOPICS, 1, 2, 4, 0, headers, lsn_header, "pgrouter.seq",
            ("c", 100, seq, None, False, row))


def golden_outbox_recorder():
    plain = ("6ba7", "Order", "o-17", "OrderCreated", '{"total": 3}')
    return [
        (SAME, _case(plain)),
        (SAME, _case(plain, lsn_header=None)),
        (SAME, _case(plain, headers=())),
        (SAME, _case(("6ba7", "é€", None, None, None), seq=2 ** 40)),
        (DECLINED, _case(("6ba7", "Unknown", "o", "T", "{}"))),   # topic not remembered
        (DECLINED, _case(("6ba7", None, "o", "T", "{}"))),        # NULL topic column
        (DECLINED, _case(("6ba7", "Order", b"\x00", "T", "{}"))),  # not text
        (DECLINED, _case(("6ba7", "Order", "o", "\ud800", "{}"))),  # no UTF-8
        (DECLINED, _case(("6ba7", "Order", "o"))),                # short
        (DECLINED, _case(["6ba7", "Order", "o", "T", "{}"])),     # not a tuple
    ]


def gen_outbox_recorder(rng):
    width = rng.randrange(5, 9)
    pool = _VALUES + (_ODD if rng.random() < 0.1 else [])
    row = tuple(rng.choice(pool) for _ in range(width))
    if rng.random() < 0.9:
        row = row[:1] + (rng.choice(list(_TOPICS)),) + row[2:]
    if rng.random() < 0.02:
        row = row[:3]
    headers = tuple((f"h{i}", rng.randrange(width)) for i in range(rng.randrange(0, 3)))
    lsn_header = rng.choice([None, _LSN])
    return (_TOPICS, 1, rng.randrange(width), rng.randrange(width), rng.randrange(width),
            headers, lsn_header, rng.choice(["pgrouter.seq", "s"]),
            ("c", rng.randrange(1 << 40), rng.randrange(1 << 32), None, False, row))
