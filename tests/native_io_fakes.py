"""The I/O boundary of ``router._native.drain`` and ``hand_over`` as fakes, and generated
inputs for them: psycopg2's ``read_message`` over a list (``Reader``) and confluent-kafka's
``Producer.produce`` recording its calls (``Producer``).

Rules:

* The fakes stand exactly where the real libraries stand: the loops under test get a bound
  ``read_message`` or ``produce`` and nothing else.
* A run returns what the loop returned or raised plus what it did to the fake (reads made,
  messages left, produce calls and attempts), so two runs compare with ``==``.
* Used by ``tests/actors/kafka/test_native_io.py`` and ``tests/router/test_native_twins.py``.
"""

from __future__ import annotations

import inspect

import psycopg2


def outcome(fn, *args):
    """What a call did, comparable across implementations: its result or its error."""
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 - the type and text are what is compared
        return "raised", type(exc), str(exc)


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


def drain_case(rng) -> tuple:
    """(messages, max_messages, max_bytes, fail_at, error): a random connection and batch."""
    messages = [Msg(rng.randbytes(rng.choice([0, 1, 7, 40, 300])), rng.randint(0, 2**64 - 1))
                for _ in range(rng.randint(0, 30))]
    limits = (rng.choice([0, 1, 2, 5, 30, 10**9]), rng.choice([0, 1, 10, 100, 1000, 10**9]))
    fail = (None, None)
    if rng.random() < 0.3:
        fail = (rng.randint(1, len(messages) + 2), rng.choice(ERRORS))
    return (messages, *limits, *fail)


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


def hand_over_case(rng) -> tuple[list, int, dict]:
    """(records, start, Producer keywords): a random batch, full queues and failures."""
    records = rand_records(rng, rng.randint(0, 15))
    start = rng.randint(0, len(records))
    kw = dict(full_at=rng.sample(range(1, 20), rng.choice([0, 0, 1, 3])))
    if rng.random() < 0.2:
        kw.update(fail_at=rng.randint(1, 20), error=rng.choice([ValueError("bad"), KeyError("k")]))
    return records, start, kw
