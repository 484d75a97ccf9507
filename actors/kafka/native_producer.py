"""librdkafka's producer driven from C, for a snapshot's packed records
(``router.snapshot.rows.PackedRecords``; ``actors/kafka/_producer.c``).

Rules:

* It is there when the extension ``actors.kafka._producer`` is built and the librdkafka that
  confluent-kafka loaded is found among the process's mapped files (Linux): the C side
  opens that same library. Otherwise ``available()`` is False and packed records are never
  made (``RdKafkaClient.takes_packed``).
* A producer of its own, with the client's producer settings (acks=all, idempotence, the
  partitioner, ``[kafka.settings]``): the values as librdkafka's strings, callables left
  out. Its records go to Kafka by the same partitioner, so keys land where the Python
  producer's would.
* Per record only C runs, without the GIL: headers, ``produce``, the delivery report. One
  report per ``produce`` call: ``report(None, count)`` once every record is acknowledged,
  else ``report((err, reason, topic, key, value), count)`` naming the largest failed
  record. A thread of its own serves the reports (``poll``).
* ``close`` purges what is not acknowledged (flush first to keep it): nothing of it lands
  after close returns.
"""

from __future__ import annotations

import functools
import threading

try:
    from . import _producer
except ImportError:  # not built (no C compiler): packed records are never made
    _producer = None

POLL_INTERVAL = 0.02  # seconds a poll waits when idle (reports wake it at once)


@functools.cache
def library_path() -> str | None:
    """The librdkafka shared library confluent-kafka loaded, or None."""
    try:
        import confluent_kafka.cimpl  # noqa: F401  (loads it)
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6 and "/librdkafka" in parts[5]:
                    return parts[5].strip()
    except (ImportError, OSError):
        pass
    return None


@functools.cache
def available() -> bool:
    if _producer is None or library_path() is None:
        return False
    try:
        _producer.load(library_path())
    except OSError:
        return False
    return True


def _text(value) -> str:
    if value is True or value is False:
        return "true" if value else "false"
    return str(value)


class NativeProducer:
    def __init__(self, conf: dict):
        """``conf``: librdkafka's settings (a ``ValueError`` names one it refuses)."""
        if not available():
            raise RuntimeError("the native producer is not available")
        self._p = _producer.Producer({k: _text(v) for k, v in conf.items()
                                      if not callable(v)})
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, daemon=True,
                                        name="pgrouter-rdkafka-native-poll")
        self._poller.start()

    def _poll_loop(self) -> None:
        poll, stop = self._p.poll, self._stop
        while not stop.is_set():
            poll(POLL_INTERVAL)

    def produce(self, blocks: list, report) -> tuple | None:
        """Every record of ``blocks`` handed over (waiting for room); None, or (err, reason,
        index) of the record librdkafka refused at once, where the hand-over stopped (the
        report then says failed too)."""
        return self._p.produce(blocks, report)

    def flush(self, timeout: float | None = None) -> int:
        """Records still unacknowledged after ``timeout`` seconds (None: until all are)."""
        return self._p.flush(-1.0 if timeout is None else timeout)

    def close(self, timeout: float = 10.0) -> None:
        try:
            self._p.flush(timeout)
        finally:
            self._stop.set()
            self._poller.join()
            self._p.close()
