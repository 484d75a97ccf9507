"""``[kafka] format``, decided here: what each record format is, for every module that
depends on it (the config's checks, ``pgrouter check``, the sink's encoders in
``actors.pipeline.formats``, the initial snapshot, ``pgrouter verify``). Besides the
status line showing it and an outbox route's rule (pgrouter's JSON only: ``router.routing.outbox``),
nothing else looks at ``cfg.kafka.format``.

* ``json``: pgrouter's JSON, the records as the router makes them (packed ones too);
* ``connect``: Kafka Connect's JSON (``router.formats.connect``);
* ``avro``: Avro in the Confluent wire format (``router.formats.avro``), schemas registered in a
  schema registry (``[kafka.registry]``) before the first record naming them.
"""

from __future__ import annotations

from typing import NamedTuple


class RecordFormat(NamedTuple):
    #: the ``[kafka] format`` value
    name: str
    #: records name their schemas by a schema registry's id: a registry is needed
    registers: bool
    #: the router's packed records (an initial snapshot's) may go to Kafka as they are
    packs: bool


FORMATS = {f.name: f for f in (RecordFormat("json", registers=False, packs=True),
                               RecordFormat("connect", registers=False, packs=False),
                               RecordFormat("avro", registers=True, packs=False))}


def record_format(kafka) -> RecordFormat:
    """The record format of a ``[kafka]`` table (``router.config.router.KafkaConfig``)."""
    return FORMATS[kafka.format]
