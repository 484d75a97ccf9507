"""The Kafka clients behind the sink's client contract: ``kafka_python`` (kafka-python) and
``librdkafka`` (confluent-kafka; what ``client = "auto"``, the default, picks when installed). ``kafka_python``'s docstring states the contract;
both partition keys with Kafka's murmur2, so they are interchangeable."""


def open_producer(cfg):
    """The sink's client ``[kafka] client`` names, "auto" already resolved by the config
    (imported only when chosen)."""
    if cfg.kafka.client == "librdkafka":
        from .librdkafka import RdKafkaClient

        return RdKafkaClient(cfg.kafka.bootstrap_servers, dict(cfg.kafka.settings))
    from .kafka_python import KafkaPythonClient

    return KafkaPythonClient(cfg.kafka.bootstrap_servers, dict(cfg.kafka.settings))
