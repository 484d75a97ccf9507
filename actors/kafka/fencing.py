"""The sink's client with ``[ha]`` in at-least-once mode: Kafka itself fences a former leader.

A leader frozen (SIGSTOP, a paused VM, a long stall) while its Kafka client still held
records sends them when it runs again: the client's threads resume before any check of the
router's own (the lease, ``router.delivery.ha``) can run, and nothing in the process can call them
back. Those records would land after the new leader's newer ones, and a compacted topic or
any consumer applying in offset order would keep the old values. Only Kafka can refuse them.

Rules:

* The producer has a transactional id shared by every router of the group: the one
  exactly-once uses (``router.delivery.exactly_once.transactional_id``: ``[kafka]
  transactional_id``, or one naming the slot, the database and the server).
* ``start`` registers it (``init_transactions``): Kafka aborts the previous leader's open
  transaction and bumps the producer epoch, so every later write of the old producer — what
  its client still queued included — is refused (``ProducerFenced`` there). What the old one
  wrote before the new one started lies before the new one's records in every partition,
  aborted for ``read_committed`` consumers.
* Records go in Kafka transactions: one begins with the first record after a commit, and the
  sink (``TransactionalSinkActor``) commits between source transactions, every
  ``[kafka] transaction_interval_ms``. Delivery reports are held until the commit, so the slot
  is confirmed only for committed records. No committed-LSN record and nothing skipped: a restart
  sends again what the slot had not confirmed, as without ``[ha]`` (at-least-once).
"""

from __future__ import annotations

from router.delivery.exactly_once import Stream, transactional_id

from .transactional import TXN_TIMEOUT, TransactionalClient


class FencingClient(TransactionalClient):
    """``TransactionalClient`` without progress: transactions only to fence."""

    def __init__(self, inner, *, transactional_id: str):
        super().__init__(inner, transactional_id=transactional_id, committed_lsn_topic="",
                         stream=None, wal_end=0, read_committed=None)

    def start(self, replication_factor: int = 1) -> int:
        """Register the transactional id: the previous leader's producer is fenced."""
        if self._rdkafka:
            self._call(self.producer.init_transactions, TXN_TIMEOUT)
        else:
            self._call(self.producer.init_transactions)
        return 0

    def commit(self, end_lsn: int) -> None:
        """Commit the open Kafka transaction; then report its records acknowledged."""
        with self._txn_lock:
            if not self._open:
                return
            self._commit_open()
        self._report_held()


def fencing_client(cfg, stream: Stream) -> FencingClient:
    """The configured client with the group's transactional id, registered (blocking; run in
    a worker thread)."""
    from . import open_producer

    tid = transactional_id(cfg.kafka.transactional_id, stream)
    client = FencingClient(open_producer(cfg, tid), transactional_id=tid)
    try:
        client.start()
    except BaseException:
        client.inner.close(1.0)
        raise
    return client
