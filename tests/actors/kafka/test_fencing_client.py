"""``actors.kafka.fencing.FencingClient`` (at-least-once with ``[ha]``) with a producer that
records the calls Kafka would see: records in Kafka transactions, reported acknowledged only
after the commit (the slot is confirmed for committed records only), no progress record."""

from __future__ import annotations

from actors.kafka.fencing import FencingClient
from tests.actors.kafka.test_transactional_client import Inner


def test_records_are_reported_only_once_their_kafka_transaction_is_committed():
    inner = Inner()
    c = FencingClient(inner, transactional_id="pgrouter-s-db-1")
    assert c.start() == 0 and inner.calls == ["init"]  # the id registered: the fence
    done = []
    c.produce([("topic", b"k", b"v", None), ("topic", b"k2", b"v", None)], 7,
              lambda *a: done.append(a))
    assert done == [] and c.in_transaction  # delivered is not enough
    c.commit(100)
    assert done == [(7, None, 1), (7, None, 1)]  # as the inner client reported them
    assert inner.calls == ["init", "begin", ("records", 2), "commit"]  # no progress record
    assert c.committed_lsn == 0  # nothing is ever skipped
    c.commit(200)  # nothing open: nothing to commit
    assert inner.calls[-1] == "commit" and len(inner.calls) == 4
