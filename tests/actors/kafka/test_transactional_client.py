"""``actors.kafka.transactional.TransactionalClient`` with a producer that records the calls
Kafka would see: what a Kafka transaction holds, and that none is left open by a record
written between source transactions."""

from __future__ import annotations

from actors.kafka.transactional import TransactionalClient
from router.delivery.exactly_once import Stream


class Producer:
    def __init__(self, calls):
        self.calls = calls

    def init_transactions(self, *timeout):
        self.calls.append("init")

    def begin_transaction(self):
        self.calls.append("begin")

    def commit_transaction(self, *timeout):
        self.calls.append("commit")


class Inner:
    def __init__(self):
        self.calls: list = []
        self.producer = Producer(self.calls)

    def produce_sync(self, topic, key, value, timeout=60.0):
        self.calls.append(("record", topic))

    def produce(self, records, ticket, on_done):
        self.calls.append(("records", len(records)))
        for _ in records:
            on_done(ticket, None, 1)

    def map_error(self, exc):
        return exc


def client() -> tuple[TransactionalClient, list]:
    inner = Inner()
    c = TransactionalClient(inner, transactional_id="t", committed_lsn_topic="p",
                            stream=Stream("1", "db", "s"), wal_end=1 << 40,
                            read_committed=lambda topic, key: None)
    return c, inner.calls


def test_a_record_between_source_transactions_is_committed_at_once():
    c, calls = client()
    c.produce_sync("pgrouter.snapshots", b"k", b"v")
    assert calls == ["begin", ("record", "pgrouter.snapshots"), "commit"]
    assert not c.in_transaction  # nothing left for the next producer to abort


def test_a_record_during_a_source_transaction_joins_its_kafka_transaction():
    c, calls = client()
    c.produce([("topic", b"k", b"v", None)], 1, lambda *a: None)
    c.produce_sync("pgrouter.snapshots", b"k", b"v")
    assert calls == ["begin", ("records", 1), ("record", "pgrouter.snapshots")]
    assert c.in_transaction
    c.commit(100)
    assert calls[3:] == [("record", "p"), "commit"]  # the progress record, then the commit
    assert not c.in_transaction and c.committed_lsn == 100
