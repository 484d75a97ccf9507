"""A topic the router makes is served by its leader before ``ensure_topics`` returns.

CreateTopics returns once the controller made the topic, a moment before the partition's
leader serves it. An idempotent producer's first request that the leader refuses in that
moment (NOT_LEADER_OR_FOLLOWER), while its next request to the partition is already on the
way, loses its records without an error: the broker takes the next request's sequence as
the first of the empty partition and refuses the retry as out of order, and the client
reports the records delivered (KAFKA-15591, fixed in Kafka 4.5). A transactions topic lost
its first three records so (BEGIN, END of the first transaction, BEGIN of the second; the
topic's first batch had base sequence 3) and the applier never learnt of that transaction.
So the client's first record to a topic it made waits for the partition's leader: right
after ``ensure_topics`` the leader answers for every partition.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from kafka import KafkaAdminClient

from actors.kafka.kafka_python import KafkaPythonClient
from actors.kafka.librdkafka import RdKafkaClient
from router.routing.topics import TopicSpec
from tests.helpers import unique

pytestmark = pytest.mark.services

TOPICS = 20  # topics made one after the other, each asked about at once
PARTITIONS = 3


def unserved(probe: AdminClient, topics: list[str]) -> list[str]:
    """The partitions of ``topics`` whose leader does not answer a ListOffsets (one question
    for them all, asked once)."""
    futures = probe.list_offsets({TopicPartition(t, p): OffsetSpec.latest()
                                  for t in topics for p in range(PARTITIONS)},
                                 request_timeout=10)
    out = []
    for tp, future in futures.items():
        try:
            future.result(timeout=20)
        except KafkaException as exc:
            out.append(f"{tp.topic}[{tp.partition}]: {exc.args[0].name()}")
    return out


def client_and_probe(client_name: str, bootstrap: str):
    """The router's client of that library, and a plain admin client connected to ask
    ``unserved`` before the first question."""
    client = (RdKafkaClient if client_name == "librdkafka" else KafkaPythonClient)(bootstrap)
    probe = AdminClient({"bootstrap.servers": bootstrap})
    probe.list_topics(timeout=10)
    return client, probe


def drop_topics(bootstrap: str, made: list[str]) -> None:
    """Deletes those of ``made`` that exist."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="pgrouter-test")
    try:
        admin.delete_topics([t for t in made if t in set(admin.list_topics())])
    finally:
        admin.close()


@pytest.mark.parametrize("client_name", ["librdkafka", "kafka-python"])
def test_a_made_topic_is_served_by_its_leader_when_ensure_topics_returns(
        client_name, kafka_bootstrap):
    client, probe = client_and_probe(client_name, kafka_bootstrap)
    made: list[str] = []
    try:
        failures = []
        for _ in range(TOPICS):
            topic = unique("leader")
            made.append(topic)
            assert client.ensure_topics([TopicSpec(topic, PARTITIONS, 1)]) == {topic}
            failures += unserved(probe, [topic])
        assert failures == [], failures
    finally:
        client.close()
        drop_topics(kafka_bootstrap, made)
