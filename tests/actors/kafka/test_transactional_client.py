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


class BumpingInner(Inner):
    """kafka-python after a recoverable error: it bumps the producer's epoch (KIP-360), which
    aborts the open transaction, and refuses a send meanwhile."""

    fatal = None

    def produce(self, records, ticket, on_done):
        from kafka.errors import IllegalStateError

        from actors.kafka.kafka_python import map_error

        exc = IllegalStateError("Cannot call send in state BUMPING_PRODUCER_EPOCH")
        raise map_error(exc) from exc


def test_a_transaction_the_client_aborted_itself_restarts_from_what_kafka_committed():
    from router.delivery.exactly_once import TransactionLost
    from router.errors import SinkUnavailable

    inner = BumpingInner()
    c = TransactionalClient(inner, transactional_id="t", committed_lsn_topic="p",
                            stream=Stream("1", "db", "s"), wal_end=1 << 40,
                            read_committed=lambda topic, key: None)
    try:
        c.produce([("topic", b"k", b"v", None)], 1, lambda *a: None)
    except SinkUnavailable as exc:  # retried by the supervisor, not "Kafka refused the records"
        assert isinstance(exc, TransactionLost), exc
        assert "BUMPING_PRODUCER_EPOCH" in str(exc) and "restarting from what Kafka" in str(exc)
    else:
        raise AssertionError("the lost transaction was not reported")


def test_a_lost_transaction_open_past_the_timeout_is_the_timeout():
    from router.delivery.exactly_once import TransactionTimedOut

    inner = BumpingInner()
    c = TransactionalClient(inner, transactional_id="t", committed_lsn_topic="p",
                            stream=Stream("1", "db", "s"), wal_end=1 << 40,
                            read_committed=lambda topic, key: None, transaction_timeout_ms=0)
    try:
        c.produce([("topic", b"k", b"v", None)], 1, lambda *a: None)
    except TransactionTimedOut as exc:
        assert "stayed open longer than transaction.timeout.ms (0 ms" in str(exc)
    else:
        raise AssertionError("the timed-out transaction was not reported")
