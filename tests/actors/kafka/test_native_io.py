"""``router._native.drain`` and ``hand_over`` (the slot reader's and the librdkafka client's
per-message loops) against their Python twins ``actors.pipeline.slot_reader._drain_py`` and
``actors.kafka.librdkafka._hand_over_py``: the same results, the same calls made (a read
consumes a message, a produce hands a record over), the same exceptions. The fakes of the
libraries are in ``tests/native_io_fakes.py``."""

from __future__ import annotations

import random

import pytest

from actors.kafka import librdkafka as rdkafka_client
from actors.pipeline import slot_reader as slot
from router.native import NATIVE
from tests.native_io_fakes import (
    Msg, Producer, confluent_produce, drain_case, drain_run, hand_over_case, hand_over_run,
    rand_records,
)

native = pytest.mark.skipif(NATIVE is None, reason="router._native off (PGROUTER_PURE_PYTHON=1)")


def test_the_loops_in_use():
    assert slot.drain is (slot._drain_py if NATIVE is None else NATIVE.drain)


# --- drain ---------------------------------------------------------------------------------


@native
def test_drain_equals_python():
    rng = random.Random(11)
    exhausted = full = raised = 0
    for _ in range(1500):
        messages, *limits_fail = drain_case(rng)
        got = drain_run(NATIVE.drain, messages, *limits_fail)
        assert got == drain_run(slot._drain_py, messages, *limits_fail), limits_fail
        if got[0][0] == "ok":
            assert [p for _, p in got[0][1][0]] == [m.payload for m in messages[:len(got[0][1][0])]]
            exhausted += got[0][1][1]
            full += not got[0][1][1]
        raised += got[0][0] == "raised"
    assert exhausted > 100 and full > 500 and raised > 50


@pytest.mark.parametrize("fn", [pytest.param("native", marks=native), "python"])
def test_drain_limits(fn):
    drain = NATIVE.drain if fn == "native" else slot._drain_py
    messages = [Msg(b"x" * 10, i) for i in range(10)]
    three = ("ok", ([(i, b"x" * 10) for i in range(3)], False))
    assert drain_run(drain, messages, 3, 10**9)[0] == three
    assert drain_run(drain, messages, 100, 25)[0] == three  # the third passes 25 bytes
    assert drain_run(drain, messages, 0, 10**9) == (("ok", ([], False)), 0, 10)
    assert drain_run(drain, messages, 100, 0) == (("ok", ([], False)), 0, 10)
    assert drain_run(drain, messages, 100, 10**9)[1:] == (11, 0)  # the 11th read said None
    bad = [Msg(b"a", 1), object()]
    assert drain_run(drain, bad, 10, 100)[0][:2] == ("raised", AttributeError)


@native
def test_drain_payload_without_length():
    messages = [Msg(5, 1), Msg(b"ab", 2)]
    assert drain_run(NATIVE.drain, messages, 10, 100) == drain_run(slot._drain_py, messages, 10,
                                                                   100)
    with pytest.raises(TypeError):
        NATIVE.drain(iter(messages).__next__, 10, 100)


# --- hand_over -----------------------------------------------------------------------------


@native
def test_hand_over_equals_python():
    rng = random.Random(12)
    stopped = done = raised = 0
    for _ in range(1500):
        records, start, kw = hand_over_case(rng)
        got = hand_over_run(NATIVE.hand_over, records, start, **kw)
        assert got == hand_over_run(rdkafka_client._hand_over_py, records, start, **kw), (start, kw)
        if got[0][0] == "ok":
            assert len(got[1]) == got[0][1] - start
            stopped += got[0][1] < len(records)
            done += got[0][1] == len(records)
        raised += got[0][0] == "raised"
    assert stopped > 100 and done > 300 and raised > 40


@native
def test_hand_over_start_past_the_end_and_negative():
    records = [("t", b"k", b"v", [])]
    want = hand_over_run(rdkafka_client._hand_over_py, records, 5)
    assert hand_over_run(NATIVE.hand_over, records, 5) == want
    for step in (NATIVE.hand_over, rdkafka_client._hand_over_py):
        with pytest.raises(ValueError):
            step(confluent_produce, records, -1, None)


def test_public_hand_over_waits_on_a_full_queue_and_goes_on():
    records = rand_records(random.Random(13), 12)
    producer = Producer(full_at={1, 4, 5, 12})
    rdkafka_client.hand_over(producer.produce, iter(records), "cb")
    assert producer.handed_over("cb") == records
    assert producer.polls == 4 and producer.attempts == 16
    with pytest.raises(ValueError):
        rdkafka_client.hand_over(Producer(fail_at=3, error=ValueError("x")).produce, records, "cb")
