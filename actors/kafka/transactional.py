"""Either Kafka client, made transactional (``[kafka] exactly_once``;
``router.delivery.exactly_once``).

Wraps a client with a ``transactional_id`` behind the same contract (``produce``,
``produce_sync``, ``ensure_topics``, ``flush``, ``close``, ``map_error``) and adds
``start()`` and ``commit(end_lsn)``.

Rules:

* ``start`` makes the compacted committed-LSN topic, refuses an id whose committed LSN
  belongs to another stream (before registering it), registers the transactional id (Kafka
  aborts a predecessor's open transaction and fences that producer), then reads the
  committed LSN with ``read_committed``: ``committed_lsn`` (``router.delivery.exactly_once``:
  only this stream's, never past the server's WAL end, read after it).
* A Kafka transaction begins with the first record handed over after a commit. Acknowledged
  records are *not* reported to the sink: their reports are held until ``commit`` wrote the
  committed-LSN record and Kafka committed the transaction; a failure is reported at once.
* ``commit`` is called by the sink only between source transactions, so a Kafka transaction
  holds whole source transactions. The committed LSN it writes never moves backwards.
* A fenced producer raises ``ProducerFenced`` with one line; it is not retried. Kafka says
  the same (an old epoch) when the broker aborted the open transaction because it stayed open
  longer than ``transaction.timeout.ms`` (the router was paused, e.g. SIGSTOP or a frozen VM):
  a failure while the open transaction is older than that is ``TransactionTimedOut``,
  retried by the supervisor's restart from what Kafka committed (a new producer, the
  committed LSN read again; nothing past it was confirmed to the slot).
* A transaction the client aborted itself after an error it recovers from (kafka-python
  bumps the producer's epoch, KIP-360, and refuses sends meanwhile; librdkafka's abortable
  errors) is ``TransactionLost``, retried the same way.
"""

from __future__ import annotations

import threading
import time
import warnings

from router.errors import ConfigError, SinkError, SinkUnavailable
from router.delivery.exactly_once import (COMMITTED_TOPIC_CONFIGS, Committed, ProducerFenced,
                                         Stream, TransactionLost, TransactionTimedOut,
                                         committed_lsn, committed_record, decode_committed,
                                         fenced_line, foreign_stream, lost_line,
                                         shared_id_line, timed_out_line)
from router.routing.topics import TopicSpec

from .compacted import read_topic
from .contracts import TransactionalProducer

#: seconds Kafka's transaction calls may take (init waits for a predecessor's abort)
TXN_TIMEOUT = 60.0


def _fenced_code(err) -> bool:
    """A librdkafka ``KafkaError`` saying another producer took over."""
    if not (hasattr(err, "code") and callable(err.code)):
        return False
    from confluent_kafka import KafkaError

    return err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                          KafkaError.INVALID_PRODUCER_EPOCH)


def _broken_code(err) -> bool:
    """A librdkafka ``KafkaError`` saying the transaction cannot go on: fenced, refused in the
    producer's state (``_STATE``, ``_FATAL``: after an abortable or fatal error), or to be
    aborted."""
    if _fenced_code(err):
        return True
    if not (hasattr(err, "code") and callable(err.code)):
        return False
    from confluent_kafka import KafkaError

    return (err.code() in (KafkaError._STATE, KafkaError._FATAL)
            or bool(err.txn_requires_abort()))


#: kafka-python's transaction states in which the open transaction is lost: an abortable
#: error, or the epoch bump (KIP-360) it makes after one, which aborts the open transaction
_LOST_STATES = ("BUMPING_PRODUCER_EPOCH", "ABORTABLE_ERROR", "ABORTING_TRANSACTION")


def _lost_state(exc: BaseException) -> bool:
    """kafka-python's ``IllegalStateError('Cannot call send in state …')`` in a lost state."""
    if type(exc).__name__ != "IllegalStateError" or not exc.args:
        return False
    text = str(exc.args[0])
    return "in state" in text and any(text.endswith(state) for state in _LOST_STATES)


def _broken(exc: BaseException | None) -> bool:
    """Is ``exc`` (or what it was raised from) Kafka saying the open transaction is lost?"""
    while exc is not None:
        if _fenced(exc) or _lost_state(exc) or _broken_code(exc.args[0] if exc.args else None):
            return True
        # kafka-python: "Cannot perform send because ... failed with errors.", the error
        if any(isinstance(a, BaseException) and _broken(a) for a in exc.args[1:]):
            return True
        exc = exc.__cause__
    return False


def _lost(exc: BaseException | None) -> bool:
    """Is ``exc`` (or what it was raised from) the client saying it aborted the open
    transaction itself, after an error it may recover from (not fenced, not fatal)?"""
    while exc is not None:
        if _lost_state(exc):
            return True
        err = exc.args[0] if exc.args else None
        requires_abort = getattr(err, "txn_requires_abort", None)
        fatal = getattr(err, "fatal", None)
        if callable(requires_abort) and requires_abort() and not (callable(fatal) and fatal()):
            return True
        exc = exc.__cause__
    return False


def _fenced(exc: BaseException | None) -> bool:
    """Is ``exc`` (or what it was raised from) Kafka saying another producer took over?"""
    while exc is not None:
        if type(exc).__name__ in ("ProducerFencedError", "InvalidProducerEpochError"):
            return True
        if _fenced_code(exc.args[0] if exc.args else None):
            return True
        exc = exc.__cause__
    return False


class TransactionalClient(TransactionalProducer):
    def __init__(self, inner, *, transactional_id: str, committed_lsn_topic: str, stream: Stream | None,
                 wal_end, read_committed, transaction_timeout_ms: int = 60_000):
        """``inner``: a client built with ``transactional_id``; ``read_committed(topic, key)``
        returns the newest committed value of ``key`` in ``topic`` (None when absent);
        ``wal_end``: the server's WAL end (no committed LSN of its stream lies past it), or a
        function reading it, called after the committed LSN was read (``runner.source``);
        ``transaction_timeout_ms``: the producer's ``transaction.timeout.ms``."""
        self.inner = inner
        self.producer = inner.producer
        self.transactional_id = transactional_id
        self.committed_lsn_topic = committed_lsn_topic
        self.stream = stream
        self.wal_end = wal_end
        #: a committed-LSN record without a stream (an older pgrouter's), not used
        self.unattributed: Committed | None = None
        self._read_committed = read_committed
        self._rdkafka = type(inner).__name__ == "RdKafkaClient"
        self._cond = threading.Condition()
        #: held while a Kafka transaction is begun or committed, and for the whole of one a
        #: single ``produce_sync`` makes for itself
        self._txn_lock = threading.RLock()
        self._open = False
        self.transaction_timeout_ms = transaction_timeout_ms
        self._opened_at = 0.0  # time.monotonic() of the open transaction's begin
        self._handed = 0  # records handed over in the open Kafka transaction
        self._acked = 0
        self._held: list = []  # (on_done, ticket, count) waiting for the commit
        self.committed_lsn = 0

    # -- errors -------------------------------------------------------------------------------

    @property
    def fatal(self):
        return self.inner.fatal

    def map_error(self, exc: BaseException) -> SinkError:
        explained = self._explain(exc)
        return explained if isinstance(explained, SinkError) and explained is not exc \
            else self.inner.map_error(exc)

    def _explain(self, exc: BaseException) -> BaseException:
        """``TransactionTimedOut`` for a lost transaction that was open longer than
        ``transaction.timeout.ms`` (the broker aborted it, and Kafka then calls the producer
        fenced as well), ``ProducerFenced`` for a fenced producer; else ``exc``."""
        if self._timed_out() and (_broken(exc) or _broken_code(self.inner.fatal)):
            return TransactionTimedOut(timed_out_line(self.transactional_id,
                                                      self.transaction_timeout_ms))
        if _fenced(exc) or _fenced_code(self.inner.fatal):
            return ProducerFenced(fenced_line(self.transactional_id))
        if self._open and _lost(exc):
            return TransactionLost(lost_line(self.transactional_id, exc))
        return exc

    def _timed_out(self) -> bool:
        """Has the open Kafka transaction been open longer than ``transaction.timeout.ms``
        (a paused router: the broker aborts it)?"""
        return self._open and (time.monotonic() - self._opened_at
                               > self.transaction_timeout_ms / 1000)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except (ProducerFenced, TransactionTimedOut, TransactionLost):
            raise
        except BaseException as exc:
            mapped = self.map_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    # -- start --------------------------------------------------------------------------------

    def start(self, replication_factor: int = 1) -> int:

        self.inner.ensure_topics([TopicSpec(self.committed_lsn_topic, 1, replication_factor,
                                            dict(COMMITTED_TOPIC_CONFIGS))])
        key = self.transactional_id.encode()
        # another stream's committed LSN under this id: refused before registering the id, which
        # would fence that stream's router
        stream = self.stream
        assert stream is not None  # a FencingClient (no stream) has its own start
        before = decode_committed(self._call(self._read_committed, self.committed_lsn_topic, key))
        if before is not None and foreign_stream(before, stream):
            raise ConfigError(shared_id_line(self.transactional_id, before, stream),
                              path="kafka.transactional_id")
        if self._rdkafka:
            self._call(self.producer.init_transactions, TXN_TIMEOUT)
        else:
            self._call(self.producer.init_transactions)
        committed = decode_committed(self._call(self._read_committed, self.committed_lsn_topic,
                                                key))
        if committed is not None and not committed.system_id:
            self.unattributed = committed
        wal_end = self.wal_end() if callable(self.wal_end) else self.wal_end
        self.committed_lsn = committed_lsn(self.transactional_id, committed, stream, wal_end)
        return self.committed_lsn

    # -- the contract ----------------------------------------------------------------------------

    def _begin(self) -> None:
        with self._txn_lock:
            if not self._open:
                self._call(self.producer.begin_transaction)
                self._open = True
                self._opened_at = time.monotonic()

    @property
    def in_transaction(self) -> bool:
        return self._open

    def produce(self, records, ticket, on_done) -> None:
        self._begin()
        cond, held = self._cond, self._held

        def hold(t, error, count, *rest):
            if error is not None:
                on_done(t, error, count, *rest)
                return
            with cond:
                held.append((on_done, t, count))
                self._acked += count
                cond.notify_all()

        with cond:
            self._handed += len(records)
        try:
            self.inner.produce(records, ticket, hold)
        except SinkError as exc:
            fenced = self._explain(exc)
            if fenced is exc:
                raise
            raise fenced from exc

    def produce_sync(self, topic, key, value, timeout: float = 60.0) -> None:
        """One record, acknowledged. It joins the open Kafka transaction (committed with it);
        with none open (a snapshot state record written between source transactions) it
        is a Kafka transaction of its own, committed at once: nothing is left open for the
        next producer to abort (a backfill's last state record was lost that way when
        the router stopped, and the backfill was done again)."""
        with self._txn_lock:
            alone = not self._open
            self._begin()
            try:
                self.inner.produce_sync(topic, key, value, timeout)
                if alone:
                    self._commit_open()
            except SinkError as exc:
                fenced = self._explain(exc)
                if fenced is exc:
                    raise
                raise fenced from exc

    def _commit_open(self) -> None:
        if self._rdkafka:
            self._call(self.producer.commit_transaction, TXN_TIMEOUT)
        else:
            self._call(self.producer.commit_transaction)
        self._open = False

    def commit(self, end_lsn: int) -> None:
        """Write the committed-LSN record and commit the open Kafka transaction; then report its
        records acknowledged."""
        with self._txn_lock:  # a record produced from another thread waits for it
            if not self._open:
                return
            end_lsn = max(end_lsn, self.committed_lsn)
            assert self.stream is not None  # a FencingClient (no stream) has its own commit
            key, value = committed_record(self.transactional_id, end_lsn, self.stream)
            self.produce_sync(self.committed_lsn_topic, key, value)
            self._commit_open()
            self.committed_lsn = end_lsn
        self._report_held()

    def _report_held(self) -> None:
        """After a commit: the held reports of its records, once all have arrived."""
        deadline = time.monotonic() + TXN_TIMEOUT
        with self._cond:
            # the commit flushed every record; their reports may still be on the way
            while self._acked < self._handed:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    raise SinkUnavailable("records of a committed Kafka transaction were not "
                                          f"reported within {TXN_TIMEOUT} s")
            held, self._held = self._held, []
            self._handed = self._acked = 0
        for on_done, ticket, count in held:
            on_done(ticket, None, count)

    def ensure_topics(self, specs) -> set[str] | None:
        return self.inner.ensure_topics(specs)

    def topic_names(self) -> frozenset[str]:
        return self.inner.topic_names()

    def flush(self, timeout: float | None = None) -> None:
        self.inner.flush(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """An open transaction is left to the next producer with this id, which aborts it."""
        with warnings.catch_warnings():  # confluent-kafka warns when its abort fails
            warnings.simplefilter("ignore")
            self.inner.close(timeout)


def committed_reader(bootstrap_servers, settings: dict):
    """``read_committed(topic, key)``: the newest value of ``key`` in ``topic`` that a
    ``read_committed`` consumer sees, reading up to the last stable offset (either producer
    client; the read is kafka-python's, ``actors.kafka.compacted``)."""

    def read(topic: str, key: bytes):
        found = None
        for k, value in read_topic(bootstrap_servers, settings, topic, timeout=TXN_TIMEOUT,
                                   committed=True):
            if k == key:
                found = value
        return found

    return read
