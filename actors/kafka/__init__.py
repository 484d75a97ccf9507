"""The Kafka clients behind the sink's client contract: ``kafka_python`` (kafka-python, the
default) and ``librdkafka`` (confluent-kafka). ``kafka_python``'s docstring states the contract;
both partition keys with Kafka's murmur2, so they are interchangeable."""
