"""The contracts of the Kafka adapters, as ``typing.Protocol``: what the rest of pgrouter may
call on a producer client, a transactional one, and a consumer of the applier. The producer
adapters (``kafka_python``, ``librdkafka``, ``transactional``) name the contracts they
implement as their bases, the consumers (``consumers``) satisfy theirs; the tests check each
(``tests/actors/kafka/test_contracts.py``, and mypy on the sink and the clients:
``tests/actors/kafka/test_types.py``).

Capabilities beyond ``Producer`` are contracts of their own, which a caller asks for with
``isinstance`` (the Protocols are ``runtime_checkable``), never by probing for a name:

* ``InlineProducer``: hands records over on the caller's thread when the local queue has
  room (``produce_now``: librdkafka); the sink uses it for small hand-overs.
* ``PackedProducer``: can produce packed records in C (``takes_packed``: librdkafka's second,
  native producer); an initial snapshot packs its records when its client does.
* ``TransactionalProducer``: records visible only with ``commit``, with the router's
  exactly-once committed LSN (``transactional``; ``fencing`` for ``[ha]``).

Rules:

* Every method blocks; the actors call them from a worker thread
  (``trio.to_thread.run_sync``), one thread at a time, except ``produce``'s ``on_done``
  callback, which the client calls from its own thread.
* Failures are ``router.errors.SinkError`` subclasses (``map_error`` turns a library's
  exception into one), so a line names what went wrong and whether it is retried.
* Reading a whole topic (a compacted one: committed LSNs, definitions) is not a method: it is
  ``actors.kafka.compacted.read_topic``, one function for every caller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from router.errors import SinkError
from router.delivery.exactly_once import Committed
from router.routing.topics import TopicSpec

#: ``(topic, key, value, headers)``; headers None or a list of ``(name, bytes)``
Record = tuple
#: ``on_done(ticket, error, count)``: every record acknowledged (``error`` None, ``count``
#: the number handed over) or the first failure
OnDone = Callable[..., None]
#: what ``produce_now`` leaves to do: hands the rest over, waiting for room (a worker thread's)
Rest = Callable[[], None]


@runtime_checkable
class Producer(Protocol):
    """The sink's client: records handed over in batches, acknowledged per batch."""

    def produce(self, records: list[Record], ticket: int, on_done: OnDone) -> None:
        """Hand ``records`` over; ``on_done`` is called once, from the client's thread."""

    def produce_sync(self, topic: str, key: bytes, value: bytes,
                     timeout: float = 60.0) -> None:
        """One record, returning once it is durable (acks=all)."""

    def ensure_topics(self, specs: Iterable[TopicSpec]) -> set[str] | None:
        """Create the topics of ``specs`` that do not exist; the names of those this call
        created (a topic another client made meanwhile is not among them)."""

    def topic_names(self) -> frozenset[str]:
        """The names of the topics the cluster holds now."""

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every record handed over is acknowledged or failed."""

    def close(self, timeout: float = 10.0) -> None:
        """Flush within ``timeout``, then release the connection."""

    def map_error(self, exc: BaseException) -> SinkError:
        """The ``SinkError`` a library's exception means."""

    @property
    def fatal(self) -> Any:
        """The fatal error the library reported (the producer cannot go on), else None."""


@runtime_checkable
class InlineProducer(Producer, Protocol):
    """A producer that can hand records over on the caller's thread without waiting."""

    def produce_now(self, records: list[Record], ticket: int, on_done: OnDone) -> Rest | None:
        """``produce`` of what the local queue takes now: None when that is every record,
        else a ``Rest`` that hands the others over (to call in a worker thread)."""


@runtime_checkable
class PackedProducer(Producer, Protocol):
    """A producer that may take packed records (``router.snapshot.rows.PackedRecords``)."""

    @property
    def takes_packed(self) -> bool:
        """Whether packed records are produced in C now (else ``produce`` unpacks them)."""


@runtime_checkable
class TransactionalProducer(Producer, Protocol):
    """A producer whose records become visible only with ``commit``, with the router's
    exactly-once committed LSN (``router.delivery.exactly_once``)."""

    transactional_id: str
    #: the end LSN of the last source transaction Kafka holds committed
    committed_lsn: int
    #: a committed-LSN record under this id that names no stream (an older pgrouter's): not used
    unattributed: Committed | None

    def start(self, replication_factor: int = 1) -> int:
        """Fence predecessors, read the committed LSN, return its LSN."""

    @property
    def in_transaction(self) -> bool:
        """Whether a Kafka transaction is open."""

    def commit(self, end_lsn: int) -> None:
        """Commit the open Kafka transaction with its committed LSN at ``end_lsn``."""


@runtime_checkable
class Consumer(Protocol):
    """The applier's consumer: the transactions topic and the data topics its END records
    name, assigned by hand (no group, no committed offsets)."""

    transactions_topic: str
    fetched: int

    def wants(self, topic: str) -> bool:
        """Whether ``topic`` is one of the data topics configured."""

    def start(self, resume: dict[str, int] | None) -> None:
        """Seek the partitions named in the stored restart positions."""

    def wait_for_transactions_topic(self, timeout: float = 1.0) -> bool:
        """Whether the transactions topic exists (waiting up to ``timeout``)."""

    def transactions_end_offset(self) -> int | None:
        """The transactions topic's end offset (None when it does not exist)."""

    def add_topics(self, topics: list[str], missing_ok: bool = False) -> None:
        """Assign the partitions of ``topics`` not assigned yet."""

    def poll(self) -> list[tuple[str, int, list[tuple[int, bytes | None]]]]:
        """Records read: ``(topic, partition, [(offset, value)])``."""

    def poll_ready(self) -> list[tuple[str, int, list[tuple[int, bytes | None]]]] | None:
        """Records already fetched, without waiting (None: nothing there)."""

    def close(self) -> None:
        """Release the connection."""
