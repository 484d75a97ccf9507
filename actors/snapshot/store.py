"""Snapshot progress in a compacted Kafka topic (``[snapshot] state_topic``).

Why Kafka and not a table in the source: the router needs no write access and no DDL on
the source database, a progress table would itself be streamed by every FOR ALL TABLES
publication, and progress lives on the cluster that holds the records it describes.

Rules:

* A state record is written with ``produce_sync`` (acknowledged, acks=all) only after
  every record it declares done is acknowledged; so after a ``kill -9`` what the topic says
  is done is in Kafka, and at most the chunk in flight is written again.
* Records are keyed (``router.snapshot.core.state_key``): the topic is compacted and read from
  the beginning at start, the last record of a key wins.
* A store holds the records of its router's slot (``[source] slot``) only: routers of other
  slots may share the topic, and their records are dropped as read, before decoding (every
  reader of ``records`` looks at its own slot's).
* The blocking methods run in a worker thread.
* The topic holds the records of every slot that ever used it (a tenth of a second and more
  to read on a topic of many slots): a start that will copy an initial snapshot begins the
  read (``StateRead``) as soon as it knows, and its checks run while Kafka answers. The
  store takes that read instead of its own once, at its first ``load``.
"""

from __future__ import annotations

import threading

import trio

from router.config.router import Config
from router.errors import SinkError, SinkUnavailable
from router.snapshot.core import SnapshotState, decode_state, encode_state, state_key
from router.routing.topics import TopicSpec

from ..kafka.compacted import READ_TIMEOUT, read_topic


class StateRead:
    """The state topic read whole in a thread of its own, from when it is made until
    ``records`` is asked for (its slot's records, as ``read_topic`` gives them)."""

    def __init__(self, cfg: Config, slot: str, timeout: float = READ_TIMEOUT):
        self.slot, self.timeout = slot, timeout
        self._done = threading.Event()
        self._records: list = []
        self._error: BaseException | None = None
        threading.Thread(target=self._read, args=(cfg,), name="pgrouter-state-read",
                         daemon=True).start()

    def _read(self, cfg: Config) -> None:
        k = cfg.kafka
        try:
            self._records = read_topic(k.bootstrap_servers, dict(k.settings),
                                       cfg.snapshot.state_topic, library=k.client,
                                       timeout=self.timeout, key_has=_needle(self.slot))
        except BaseException as exc:  # noqa: BLE001 — raised where the records are asked for
            self._error = exc
        finally:
            self._done.set()

    def records(self) -> list:
        """Blocking: the read's ``(key, value)`` pairs, or its failure raised here."""
        if not self._done.wait(self.timeout + 5.0):
            raise SinkUnavailable(f"the snapshot state topic was not read in {self.timeout} s")
        if self._error is not None:
            raise self._error
        return self._records


def _needle(slot: str) -> bytes:
    """A key names its slot as a JSON string (``state_key``): keys without it are other
    slots'."""
    return b'"' + slot.encode() + b'"'


class StateStore:
    def __init__(self, cfg: Config, client, slot: str, read: StateRead | None = None):
        self.cfg = cfg
        self.slot = slot  # the start's ``Source`` slot: only its records are kept
        self.topic = cfg.snapshot.state_topic
        self.client = client  # the sink's Kafka client (produce_sync, ensure_topics)
        self.records: dict[bytes, SnapshotState] = {}
        #: the topic was read whole (``load``) and every record since was written through
        #: this store: ``records`` is what a new read would give (of the keys this router
        #: writes)
        self.loaded = False
        #: the last ``load`` found no state topic in Kafka and created it (``[kafka]
        #: create_topics``): whatever it recorded is gone (``initial.interrupted``)
        self.created = False
        #: begun before the store was made (``StateRead``): its first ``load`` takes it
        self._read = read if read is not None and read.slot == slot else None

    def load(self, timeout: float = READ_TIMEOUT) -> dict[bytes, SnapshotState]:
        """Every state record of the slot (last per key), read from the beginning to the end
        (with the library the router produces with)."""
        self._ensure()
        k, slot = self.cfg.kafka, self.slot
        out = {}
        read, self._read = self._read, None
        pairs = (read.records() if read is not None else
                 read_topic(k.bootstrap_servers, dict(k.settings), self.topic,
                            library=k.client, timeout=timeout, key_has=_needle(slot)))
        for key, value in pairs:
            p = decode_state(value)
            if p is not None and key and p.slot == slot:
                out[key] = p
        self.records = out
        self.loaded = True
        return out

    def _ensure(self) -> None:
        if self.cfg.kafka.create_topics:
            rf = max([r.topic_settings.replication_factor for r in self.cfg.routes] or [1])
            made = self.client.ensure_topics([TopicSpec(self.topic, 1, rf,
                                                        {"cleanup.policy": "compact"})])
            self.created = self.topic in (made or ())

    def adopt(self, other: "StateStore") -> None:
        """What ``other`` read and wrote, taken instead of reading the topic again (the
        initial snapshot's store, handed to the stream's backfill actor of the same run)."""
        self.records, self.loaded = dict(other.records), other.loaded

    def get(self, key: SnapshotState) -> SnapshotState | None:
        return self.records.get(state_key(key))

    def put(self, p: SnapshotState) -> None:
        key, value = encode_state(p)
        self.client.produce_sync(self.topic, key, value)
        self.records[key] = p

    async def aput(self, p: SnapshotState) -> None:
        await trio.to_thread.run_sync(self.put, p)

    def put_many(self, states: list[SnapshotState], timeout: float = 60.0) -> None:
        """Every record of ``states``, handed over at once and acknowledged together (one
        round trip instead of one per record: a transaction of many signals). A Kafka
        transaction's client acknowledges only at its commit: there, one by one."""
        if len(states) <= 1 or getattr(self.client, "in_transaction", None) is not None:
            for p in states:
                self.put(p)
            return
        encoded = [encode_state(p) for p in states]
        done = threading.Event()
        outcome: list = []

        def on_done(_ticket, error, *_rest) -> None:
            outcome.append(error)
            done.set()
        self.client.produce([(self.topic, k, v, None) for k, v in encoded], 0, on_done)
        if not done.wait(timeout):
            raise SinkUnavailable(f"state records to {self.topic} not acknowledged within "
                                  f"{timeout:g} s")
        if outcome[0] is not None:
            error = outcome[0]
            raise error if isinstance(error, SinkError) else self.client.map_error(error)
        for (key, _), p in zip(encoded, states):
            self.records[key] = p

    async def aput_many(self, states: list[SnapshotState]) -> None:
        if states:
            await trio.to_thread.run_sync(self.put_many, states)

    async def aload(self) -> dict[bytes, SnapshotState]:
        return await trio.to_thread.run_sync(self.load)

    async def forget_initial(self, slot: str) -> None:
        """A new initial snapshot of ``slot`` (the slot was created again): the per-table
        records an earlier snapshot of that name left (request ``initial``, done or
        running) say nothing of this one, so finishing this one by backfill must neither
        skip nor resume those tables on their word. They are overwritten (state
        ``superseded``, no request)."""
        for p in list(self.records.values()):
            if p.kind == "backfill" and p.slot == slot and p.request == "initial":
                await self.aput(SnapshotState("backfill", slot, "superseded", route=p.route,
                                              table=p.table))
