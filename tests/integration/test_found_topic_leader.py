"""A topic the router finds, not makes, is served by its leader before its first record.

An operator or a script may make a route's topic a moment before the router starts (or
between the router's listing of the cluster's topics and its first record to it), or the
broker makes it on a first metadata request (``auto.create.topics.enable``). Such a topic is
as new as one the router makes (``tests/integration/test_new_topic_leader.py``): its leader
may still refuse the first request with NOT_LEADER_OR_FOLLOWER, and an idempotent producer
whose next request is already on the way then loses the first records silently
(KAFKA-15591). So ``ensure_topics`` asks the leader of every partition of a topic it finds
too, once per client, listed by ``topic_names`` or not: right after it returns the leader
answers for every partition.
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from router.routing.topics import TopicSpec
from tests.helpers import unique
from tests.integration.test_new_topic_leader import (PARTITIONS, client_and_probe, drop_topics,
                                                    unserved)

pytestmark = pytest.mark.services

ROUNDS = 3  # each: AT_ONCE topics made by another client, then the router's call for them
AT_ONCE = 30


@pytest.mark.parametrize("client_name,listed", [
    ("librdkafka", False), ("librdkafka", True),  # listed by ``topic_names`` before, or not
    ("kafka-python", False)], ids=["librdkafka-found", "librdkafka-listed", "kafka-python"])
def test_a_topic_made_by_another_client_is_served_when_ensure_topics_returns(
        client_name, listed, kafka_bootstrap):
    client, probe = client_and_probe(client_name, kafka_bootstrap)
    other = AdminClient({"bootstrap.servers": kafka_bootstrap})  # an operator's, no wait
    made: list[str] = []
    try:
        failures = []
        for _ in range(ROUNDS):
            topics = [unique("found") for _ in range(AT_ONCE)]
            made += topics
            for future in other.create_topics([NewTopic(t, PARTITIONS, 1)
                                               for t in topics]).values():
                future.result(timeout=20)
            if listed:  # the router's listing at its start (the outbox routes')
                client.topic_names()
            assert client.ensure_topics([TopicSpec(t, PARTITIONS, 1) for t in topics]) == set()
            failures += unserved(probe, topics)
        assert failures == [], failures
    finally:
        client.close()
        drop_topics(kafka_bootstrap, made)
