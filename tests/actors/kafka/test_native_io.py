"""``router._native.drain`` and ``hand_over`` (the slot reader's and the librdkafka client's
per-message loops) against their Python twins ``actors.pipeline.slot_reader._drain_py`` and
``actors.kafka.librdkafka._hand_over_py``: the same results, the same calls made (a read
consumes a message, a produce hands a record over), the same exceptions."""

from __future__ import annotations

import inspect
import random

import psycopg2
import pytest

from actors.kafka import librdkafka as rdkafka_client
from actors.pipeline import slot_reader as slot
from router.native import NATIVE

native = pytest.mark.skipif(NATIVE is None, reason="router._native off (PGROUTER_PURE_PYTHON=1)")


def outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 - the type and text are what is compared
        return "raised", type(exc), str(exc)


def test_the_loops_in_use():
    assert slot.drain is (slot._drain_py if NATIVE is None else NATIVE.drain)


# --- drain ---------------------------------------------------------------------------------


class Msg:
    __slots__ = ("payload", "data_start")

    def __init__(self, payload, data_start):
        self.payload, self.data_start = payload, data_start


class Reader:
    """``read_message`` over a list (None once exhausted), raising ``error`` at call ``fail_at``."""

    def __init__(self, messages, fail_at=None, error=None):
        self.messages, self.fail_at, self.error, self.calls = list(messages), fail_at, error, 0

    def __call__(self):
        self.calls += 1
        if self.calls == self.fail_at:
            raise self.error
        return self.messages.pop(0) if self.messages else None


def drain_run(fn, messages, max_messages, max_bytes, fail_at=None, error=None):
    reader = Reader(messages, fail_at, error)
    return outcome(fn, reader, max_messages, max_bytes), reader.calls, len(reader.messages)


ERRORS = [psycopg2.OperationalError("server closed the connection"), RuntimeError("boom")]


@native
def test_drain_equals_python():
    rng = random.Random(11)
    exhausted = full = raised = 0
    for _ in range(1500):
        messages = [Msg(rng.randbytes(rng.choice([0, 1, 7, 40, 300])), rng.randint(0, 2**64 - 1))
                    for _ in range(rng.randint(0, 30))]
        limits = (rng.choice([0, 1, 2, 5, 30, 10**9]), rng.choice([0, 1, 10, 100, 1000, 10**9]))
        fail = (None, None)
        if rng.random() < 0.3:
            fail = (rng.randint(1, len(messages) + 2), rng.choice(ERRORS))
        got = drain_run(NATIVE.drain, messages, *limits, *fail)
        assert got == drain_run(slot._drain_py, messages, *limits, *fail), (limits, fail)
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


def confluent_produce(topic, value=None, key=None, partition=-1, callback=None,
                      on_delivery=None, timestamp=0, headers=None):
    """confluent-kafka's ``Producer.produce`` signature (positional order as in its kwlist)."""


SIGNATURE = inspect.signature(confluent_produce)


class Producer:
    """confluent-kafka's Producer as hand_over uses it: ``produce`` records every call's
    arguments as given and raises BufferError (queue full) at the attempts in ``full_at`` and
    ``error`` at attempt ``fail_at``."""

    def __init__(self, full_at=(), fail_at=None, error=None):
        self.full_at, self.fail_at, self.error = set(full_at), fail_at, error
        self.attempts, self.calls, self.polls = 0, [], 0

    def produce(self, *args, **kwargs):
        self.attempts += 1
        if self.attempts in self.full_at:
            raise BufferError("Local: Queue full")
        if self.attempts == self.fail_at:
            raise self.error
        self.calls.append((args, kwargs))

    def poll(self, timeout):
        self.polls += 1

    def handed_over(self, on_delivery) -> list:
        """(topic, key, value, headers) of every call, which must mean to confluent-kafka:
        that record, the partitioner's choice, ``on_delivery`` as its callback, time now."""
        out = []
        for args, kwargs in self.calls:
            bound = SIGNATURE.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            assert (a["partition"], a["timestamp"]) == (-1, 0)
            assert {a["callback"], a["on_delivery"]} == {on_delivery, None}
            out.append((a["topic"], a["key"], a["value"], a["headers"]))
        return out


def rand_records(rng, n: int) -> list:
    return [(rng.choice(["a", "tópico"]), rng.choice([None, b"k%d" % i]),
             rng.randbytes(rng.randint(0, 20)), rng.choice([None, [("pgrouter.seq", b"%d" % i)]]))
            for i in range(n)]


ON_DELIVERY = object()  # a Tally in the client


def hand_over_run(fn, records, start, **producer_kw):
    producer = Producer(**producer_kw)
    got = outcome(fn, producer.produce, records, start, ON_DELIVERY)
    assert producer.handed_over(ON_DELIVERY) == records[start:start + len(producer.calls)]
    return got, producer.calls, producer.attempts


@native
def test_hand_over_equals_python():
    rng = random.Random(12)
    stopped = done = raised = 0
    for _ in range(1500):
        records = rand_records(rng, rng.randint(0, 15))
        start = rng.randint(0, len(records))
        kw = dict(full_at=rng.sample(range(1, 20), rng.choice([0, 0, 1, 3])))
        if rng.random() < 0.2:
            kw.update(fail_at=rng.randint(1, 20),
                      error=rng.choice([ValueError("bad"), KeyError("k")]))
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
