"""confluent-kafka (librdkafka) behind the sink's client contract.

The contract is exactly ``actors.kafka.kafka_python``'s: ``produce(records, ticket, on_done)``
hands ``(topic, key, value, headers)`` records over and ``on_done(ticket, error, count)`` is
called once from the client's thread, when all of them are acknowledged (``error`` None) or
at the first failure (``router.delivery.tally``); ``produce_sync`` sends one record and returns
when it is durable; ``ensure_topics``; ``flush``; ``close(timeout)``;
``map_error(exc) -> SinkError``.

Rules:

* acks=all and ``enable.idempotence`` (per-partition order survives retries), and the
  ``murmur2_random`` partitioner: a key lands on the partition the Java client and
  ``KafkaPythonClient`` choose, so the clients are interchangeable on existing topics.
* librdkafka only reports deliveries from ``poll``/``flush``. A dedicated poll thread serves
  them, so reports arrive within milliseconds even when nothing else calls into the client.
* A full local queue (``BufferError``) is backpressure, not a failure: ``produce`` waits for
  deliveries and retries, so the sink's thread blocks like kafka-python's ``send`` does.
* ``[kafka] settings`` use the common vocabulary of ``router.config.kafka_settings``.
* Packed records (``router.snapshot.rows.PackedRecords``: an initial snapshot's, when
  ``takes_packed``) go through a second producer, driven from C with the same settings
  (``actors.kafka.native_producer``); ``flush`` and ``close`` cover both. Only an initial
  snapshot sends them, and the stream starts once they are all acknowledged, so the two
  producers never carry records whose order matters against each other.
"""

from __future__ import annotations

import threading
import time

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from router.delivery.tally import Tally, record_too_large
from router.formats.tombstones import keyless_refused
from router.native import NATIVE
from router.routing.topics import collision, twin_named
from router.snapshot.rows import PackedRecords
from router.errors import ConfigError, RecordTooLarge, SinkError, SinkRejected, SinkUnavailable
from router.config.kafka_settings import LIBRDKAFKA, translate

from . import native_producer
from .admin import held, wait_led
from .contracts import InlineProducer, PackedProducer
from .native_producer import NativeProducer
from .rdkafka_conf import _ADMIN_KEYS, _LOGGER, DEFAULTS

POLL_INTERVAL = 0.02  # seconds a poll waits when idle (reports wake it at once; close waits for it)

_TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE,
                        KafkaError.INVALID_MSG_SIZE})
_UNAVAILABLE = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                          KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT,
                          KafkaError._TIMED_OUT_QUEUE, KafkaError._QUEUE_FULL,
                          KafkaError._RESOLVE, KafkaError._PURGE_QUEUE,
                          KafkaError._PURGE_INFLIGHT, KafkaError._DESTROY,
                          KafkaError._WAIT_COORD, KafkaError._NODE_UPDATE})


def map_error(exc: BaseException) -> SinkError:
    """librdkafka errors → the router's tree, by error code and librdkafka's own flags."""
    if isinstance(exc, SinkError):
        return exc
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if not isinstance(err, KafkaError):
        if isinstance(exc, BufferError):
            return SinkUnavailable(f"Kafka client queue full: {exc}")
        return SinkUnavailable(f"Kafka client failed: {exc!r}")
    code = err.code()
    text = f"{err.name()}: {err.str()}"
    if code in _TOO_LARGE:
        return RecordTooLarge(f"a record is larger than Kafka accepts ({text}): raise "
                              "[kafka.settings] max_request_size (message.max.bytes) and "
                              "the topic's max.message.bytes")
    if code == KafkaError.INVALID_RECORD:
        return keyless_refused(None, text)
    if err.fatal():
        return SinkRejected(f"Kafka producer failed fatally: {text}")
    if code in _UNAVAILABLE or err.retriable():
        return SinkUnavailable(f"Kafka unavailable: {text}")
    return SinkRejected(f"Kafka refused the records: {text}")


def _hand_over_py(produce, records, start, on_delivery) -> int:
    """``router._native.hand_over`` in Python: ``produce`` with positional arguments only
    (confluent-kafka parses keywords slowly): topic, value, key, partition (-1: the
    partitioner chooses), callback, on_delivery, timestamp (0: now), headers."""
    if start < 0:
        raise ValueError("hand_over: negative start")
    for i in range(start, len(records)):
        topic, key, value, headers = records[i]
        try:
            if headers is None:
                produce(topic, value, key, -1, on_delivery)
            else:
                produce(topic, value, key, -1, on_delivery, None, 0, headers)
        except BufferError:
            return i
    return len(records)


_step = NATIVE.hand_over if NATIVE is not None else _hand_over_py


def hand_over(produce, records, on_delivery, start: int = 0) -> None:
    """Every record from ``records[start]`` on to ``produce``; a full local queue
    (``BufferError``) waits for deliveries (backpressure) and goes on where it stopped."""
    step = _step
    if type(records) is not list:
        records = list(records)
    i = step(produce, records, start, on_delivery)
    while i < len(records):
        produce.__self__.poll(POLL_INTERVAL)
        i = step(produce, records, i, on_delivery)


class _Failure:
    """``on_done`` with librdkafka's ``KafkaError`` wrapped in the ``KafkaException`` that
    ``map_error`` reads; a record the broker refused as too large is named
    (``router.delivery.tally.record_too_large``) from the report's message (the Tally passes the
    largest failed record of the batch)."""

    __slots__ = ("on_done",)

    def __init__(self, on_done):
        self.on_done = on_done

    def __call__(self, ticket, err, count, msg=None):
        if err is None:
            return self.on_done(ticket, None, count)
        if msg is not None and err.code() in _TOO_LARGE:
            return self.on_done(ticket, record_too_large(msg.topic(), msg.key(), msg.value()),
                                count)
        if err.code() == KafkaError.INVALID_RECORD:  # a keyless record, a compacted topic
            return self.on_done(ticket, keyless_refused(None if msg is None else msg.topic(),
                                                        f"{err.name()}: {err.str()}"), count)
        self.on_done(ticket, KafkaException(err), count)


class RdKafkaClient(InlineProducer, PackedProducer):
    def __init__(self, bootstrap_servers, settings: dict | None = None, *,
                 transactional_id: str | None = None):
        servers = (bootstrap_servers if isinstance(bootstrap_servers, str)
                   else ",".join(bootstrap_servers))
        conf = dict(DEFAULTS)
        conf.update(translate(dict(settings or {}), LIBRDKAFKA))
        conf.update({"bootstrap.servers": servers, "acks": "all",
                     "enable.idempotence": True, "partitioner": "murmur2_random"})
        if transactional_id:  # actors.kafka.transactional drives the transactions
            conf["transactional.id"] = transactional_id
        self._timeout = conf["request.timeout.ms"] / 1000
        self._max_message = int(conf.get("message.max.bytes", 1_000_000))
        self._admin_conf = {k: v for k, v in conf.items()
                            if k == "bootstrap.servers" or k.startswith(_ADMIN_KEYS)}
        self._fatal: KafkaError | None = None
        #: packed records' producer (``native_producer``), made at the first of them
        self._native_conf = None if transactional_id else dict(conf)
        self._native: NativeProducer | None = None
        self._native_lock = threading.Lock()
        conf["error_cb"] = self._on_error
        conf["logger"] = _LOGGER
        self._admin_conf["logger"] = _LOGGER
        try:
            self.producer = Producer(conf)
        except KafkaException as exc:
            raise ConfigError(f"librdkafka refused the configuration: {exc.args[0].str()}",
                              path="kafka.settings") from exc
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"librdkafka refused the configuration: {exc}",
                              path="kafka.settings") from exc
        self._admin: AdminClient | None = None
        self._known_topics: set[str] = set()
        self._listed: frozenset | None = None  # topic_names' (the outbox folds' start)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="pgrouter-rdkafka-poll",
                                        daemon=True)
        self._poller.start()

    map_error = staticmethod(map_error)

    @property
    def fatal(self) -> KafkaError | None:
        return self._fatal

    @property
    def takes_packed(self) -> bool:
        """Packed records (``router.snapshot.rows.PackedRecords``) are produced in C: not by
        a transactional producer (its records belong to its transactions)."""
        return self._native_conf is not None and native_producer.available()

    # -- client thread ------------------------------------------------------------------------

    def _poll_loop(self) -> None:
        poll = self.producer.poll
        stop = self._stop
        while not stop.is_set():
            try:
                poll(POLL_INTERVAL)
            except KafkaException as exc:  # a fatal error (a fenced transactional producer)
                if self._fatal is None:
                    self._fatal = exc.args[0]
                stop.wait(POLL_INTERVAL)

    def _on_error(self, err: KafkaError) -> None:
        # transient client-level errors (broker down…) surface per record as delivery
        # timeouts; only a fatal error (idempotence state lost) ends the producer
        if err.fatal() and self._fatal is None:
            self._fatal = err

    # -- contract -------------------------------------------------------------------------------

    def produce(self, records, ticket, on_done) -> None:
        if type(records) is PackedRecords:
            return self._produce_packed(records, ticket, on_done)
        # per record only C runs on the poll thread: librdkafka's report → the Tally
        self._hand_over(records, Tally(len(records), _Failure(on_done), ticket), 0)

    def _produce_packed(self, records: PackedRecords, ticket, on_done) -> None:
        """``produce`` of packed records by the native producer; one report for them all."""
        conf = self._native_conf
        if conf is None or not native_producer.available():  # not ``takes_packed``
            return self.produce(list(records), ticket, on_done)
        if self._fatal is not None:
            raise map_error(KafkaException(self._fatal))
        with self._native_lock:
            if self._native is None:
                try:
                    self._native = NativeProducer(conf)
                except ValueError as exc:
                    raise ConfigError(f"librdkafka refused the configuration: {exc}",
                                      path="kafka.settings") from exc
        max_message = self._max_message

        def report(failure, count):
            if failure is None:
                return on_done(ticket, None, count)
            code, reason, topic, key, value = failure
            if code in _TOO_LARGE:
                return on_done(ticket, record_too_large(topic, key, value), 0)
            on_done(ticket, KafkaException(KafkaError(code, reason,
                                                      fatal=code == KafkaError._FATAL)), 0)

        refused = self._native.produce(records.blocks, report)
        if refused is not None:
            code, reason, index = refused
            if code in _TOO_LARGE:
                topic, key, value, _ = next(r for i, r in enumerate(records) if i == index)
                raise record_too_large(topic, key, value, producer_limit=max_message)
            raise map_error(KafkaException(KafkaError(code, reason,
                                                      fatal=code == KafkaError._FATAL)))

    def produce_now(self, records, ticket, on_done):
        """``produce`` without waiting, on the caller's thread: the records the local queue
        takes now are handed over. None when that is all of them; else a callable that hands
        over the rest, waiting for room (call it in a worker thread)."""
        if type(records) is PackedRecords:  # in C, without the GIL: in a worker thread
            return lambda: self._produce_packed(records, ticket, on_done)
        report = Tally(len(records), _Failure(on_done), ticket)
        if type(records) is not list:
            records = list(records)
        if self._fatal is not None:
            raise map_error(KafkaException(self._fatal))
        try:
            i = _step(self.producer.produce, records, 0, report)
        except KafkaException as exc:
            raise self._refused(records, exc) from exc
        if i >= len(records):
            return None
        return lambda: self._hand_over(records, report, i)

    def _hand_over(self, records, report, start: int) -> None:
        if self._fatal is not None:
            raise map_error(KafkaException(self._fatal))
        try:
            hand_over(self.producer.produce, records, report, start)
        except KafkaException as exc:
            raise self._refused(records, exc) from exc

    def _refused(self, records, exc: KafkaException):
        if exc.args and exc.args[0].code() in _TOO_LARGE:
            return self._too_large(records)
        return map_error(exc)

    def _too_large(self, records) -> RecordTooLarge:
        """The record librdkafka refused before sending: above ``message.max.bytes``."""
        def size(r):
            return len(r[1] or b"") + len(r[2] or b"")
        big = next((r for r in records if size(r) > self._max_message), None)
        topic, key, value, headers = big or max(records, key=size)
        return record_too_large(topic, key, value, headers=headers,
                                producer_limit=self._max_message)

    def produce_sync(self, topic: str, key: bytes, value: bytes, timeout: float = 60.0) -> None:
        done = threading.Event()
        outcome: list = []

        def report(err, msg):
            outcome.append(err)
            done.set()

        try:
            self.producer.produce(topic, value, key, on_delivery=report)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() in _TOO_LARGE:
                raise self._too_large([(topic, key, value, None)]) from exc
            raise map_error(exc) from exc
        except BufferError as exc:
            raise map_error(exc) from exc
        deadline = time.monotonic() + timeout
        while not done.wait(POLL_INTERVAL):
            if self._fatal is not None:
                raise map_error(KafkaException(self._fatal))
            if time.monotonic() > deadline:
                raise SinkUnavailable(f"record to {topic} not acknowledged within {timeout} s")
        if outcome[0] is not None:
            failed = KafkaException(outcome[0])
            if outcome[0].code() in _TOO_LARGE:
                raise record_too_large(topic, key, value) from failed
            raise map_error(failed) from failed

    def topic_names(self) -> frozenset[str]:
        try:
            names = frozenset(self.producer.list_topics(timeout=self._timeout).topics)
        except KafkaException as exc:
            raise map_error(exc) from exc
        self._listed = names  # listed, not yet served (ensure_topics asks their leaders)
        return names

    def ensure_topics(self, specs) -> set[str]:
        """The topics of ``specs`` made when missing, and every one of them, made or found,
        served by its partitions' leader before it is written to (``admin.wait_led``: one
        question for all of them, asked once per topic and client): a topic made by someone
        else just before (an operator, a script, a broker's auto-creation) is as new."""
        missing = [s for s in specs if s.name not in self._known_topics]
        created: set[str] = set()
        if not missing:
            return created
        try:
            if self._admin is None:
                self._admin = AdminClient(self._admin_conf)
            existing = held(self._admin, [s.name for s in missing], self._timeout)
            new = [NewTopic(s.name, s.partitions, s.replication_factor,
                            config={k: str(v) for k, v in s.configs.items()})
                   for s in missing if s.name not in existing]
            if new:
                futures = self._admin.create_topics(new, request_timeout=self._timeout)
                for name, future in futures.items():
                    try:
                        future.result(timeout=self._timeout * 2)
                        created.add(name)
                    except KafkaException as exc:
                        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                            twin = twin_named(str(exc))
                            raise exc if twin is None else collision(name, twin, self._listed)
            # their first records wait for their leaders (``admin.wait_led``: else lost)
            wait_led(self._admin, {**existing, **{t.topic: t.num_partitions for t in new}},
                     self._timeout)
        except KafkaException as exc:
            raise map_error(exc) from exc
        except TimeoutError as exc:  # concurrent.futures.TimeoutError is TimeoutError on 3.11
            raise SinkUnavailable(f"Kafka did not answer topic creation: {exc!r}") from exc
        self._known_topics.update(s.name for s in missing)
        return created

    def flush(self, timeout: float | None = None) -> None:
        left = self.producer.flush(-1 if timeout is None else timeout)
        if self._native is not None:
            left += self._native.flush(timeout)
        if left:
            raise SinkUnavailable(f"{left} record(s) still unacknowledged after {timeout} s")
        if self._fatal is not None:
            raise map_error(KafkaException(self._fatal))

    def close(self, timeout: float = 10.0) -> None:
        """Wait up to ``timeout`` for what is queued, then drop the rest: after close nothing
        of this producer can land behind a successor's records (what was dropped was never
        confirmed, so PostgreSQL sends it again)."""
        try:
            if self._native is not None:
                self._native.close(timeout)
        except Exception:  # closing after a failure: what is lost was never confirmed
            pass
        try:
            if self.producer.flush(timeout):
                self.producer.purge(in_queue=True, in_flight=True, blocking=False)
                self.producer.flush(min(timeout, 1.0))
        except Exception:  # closing after a failure: what is lost was never confirmed
            pass
        finally:
            self._stop.set()
            self._poller.join(POLL_INTERVAL * 10)
            try:
                self.producer.close()
            except Exception:
                pass
