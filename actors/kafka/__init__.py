"""The Kafka clients behind the sink's client contract (``contracts``): ``kafka_python``
(kafka-python) and ``librdkafka`` (confluent-kafka; what ``client = "auto"``, the default,
picks when installed). Both partition keys with Kafka's murmur2, so they are
interchangeable."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .kafka_python import KafkaPythonClient
    from .librdkafka import RdKafkaClient


def open_producer(cfg, transactional_id: str | None = None) -> KafkaPythonClient | RdKafkaClient:
    """The sink's client ``[kafka] client`` names, "auto" already resolved by the config
    (imported only when chosen); with ``transactional_id`` for ``actors.kafka.transactional``
    to drive."""
    k = cfg.kafka
    if k.client == "librdkafka":
        from .librdkafka import RdKafkaClient

        return RdKafkaClient(k.bootstrap_servers, dict(k.settings),
                             transactional_id=transactional_id)
    from .kafka_python import KafkaPythonClient

    return KafkaPythonClient(k.bootstrap_servers, dict(k.settings),
                             transactional_id=transactional_id)
