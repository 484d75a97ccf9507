"""The snapshot state topic (``[snapshot] state_topic``) read whole in a thread of its own:
``StateRead``, taken by ``actors.snapshot.store.StateStore`` at its first load.

Rules:

* The topic holds the records of every slot that ever used it (a tenth of a second and more
  to read on a topic of many slots, tens of thousands of records): a start that reads it
  (``[snapshot] mode = "initial"`` with ``create_slot``: to copy a new slot's tables, or to
  learn whether an existing slot's copy finished) begins the read as soon as its config is
  loaded (``actors.cli.run``), before the pipeline's modules are imported: librdkafka fetches
  the topic in its own threads while they load, and the records are taken from its queue
  while the start's checks run.
* Only the records whose key names the slot are kept (``read_topic``'s ``key_has``).
* This module imports neither trio nor a Kafka client (the read's thread imports the client):
  the read starts before the start's slow imports, not after them.
"""

from __future__ import annotations

import threading

from router.config.router import Config
from router.errors import SinkUnavailable

from ..kafka.compacted import READ_TIMEOUT, read_topic


class StateRead:
    """The state topic read whole in a thread of its own, from when it is made until
    ``records`` is asked for (its slot's records, as ``read_topic`` gives them)."""

    def __init__(self, cfg: Config, slot: str, timeout: float = READ_TIMEOUT,
                 held: bool = False):
        self.slot, self.timeout = slot, timeout
        #: set: the records are taken from the client's queue (``read_topic``'s ``held``)
        self._taking = threading.Event()
        if not held:
            self._taking.set()
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
                                       timeout=self.timeout, key_has=slot_needle(self.slot),
                                       held=self._taking)
        except BaseException as exc:  # noqa: BLE001 — raised where the records are asked for
            self._error = exc
        finally:
            self._done.set()

    def take(self) -> None:
        """The records are taken from the client's queue from now on (a read begun
        ``held``)."""
        self._taking.set()

    def records(self) -> list:
        """Blocking: the read's ``(key, value)`` pairs, or its failure raised here."""
        self._taking.set()
        if not self._done.wait(self.timeout + 5.0):
            raise SinkUnavailable(f"the snapshot state topic was not read in {self.timeout} s")
        if self._error is not None:
            raise self._error
        return self._records


def slot_needle(slot: str) -> bytes:
    """A key names its slot as a JSON string (``router.snapshot.core.state_key``): keys
    without it are other slots'."""
    return b'"' + slot.encode() + b'"'


def read_at_start(cfg: Config) -> StateRead | None:
    """The read a start of ``pgrouter run`` makes whatever it finds (``[snapshot] mode =
    "initial"`` with ``create_slot``: ``InitialSnapshot.begin`` when the slot is missing,
    ``initial.interrupted`` when it exists), begun now and ``held`` until the start
    ``take``s it (once its modules are imported: the records' Python objects are made while
    the start waits for PostgreSQL, not while it imports); None when it makes none."""
    if cfg.snapshot.mode != "initial" or not cfg.source.create_slot:
        return None
    return StateRead(cfg, cfg.source.slot, held=True)
