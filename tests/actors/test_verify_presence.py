"""Whether verify may say a topic "does not exist" (``actors.verify.presence``): only on
Kafka's "unknown topic"; a transient error in the topic's metadata (no leader yet, right
after its creation or a broker's restart) is asked again and, if it lasts, is "Kafka
unavailable" naming the topic. The metadata come from the real Kafka (both clients); the
transient answers are real client error objects set in them (a leaderless partition cannot
be made on demand without stopping a broker)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError
from confluent_kafka.admin import AdminClient, NewTopic

from actors.verify.presence import (MISSING, READY, REFUSED, TRANSIENT, await_topic,
                                    kafka_python_state, rdkafka_state)
from actors.verify.topic import Decoder, fold_topic
from router.config.kafka_settings import KAFKA_PYTHON, LIBRDKAFKA
from router.errors import SinkError, SinkUnavailable
from router.verify.fold import TopicFold
from tests.helpers import unique


@pytest.fixture
def topic(kafka_bootstrap):
    name = unique("verify_presence")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(60)
    yield name
    admin.delete_topics([name])[name].result(60)


def _rdkafka_meta(bootstrap, name):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify-presence-test",
                         "allow.auto.create.topics": False})
    try:
        deadline = time.monotonic() + 120  # a topic made a moment ago: a leader soon
        while True:
            meta = consumer.list_topics(name, timeout=30).topics.get(name)
            if rdkafka_state(meta)[0] in (READY, MISSING) or time.monotonic() > deadline:
                return meta
            time.sleep(0.1)
    finally:
        consumer.close()


def test_rdkafka_only_unknown_topic_is_missing(kafka_bootstrap, topic):
    absent = _rdkafka_meta(kafka_bootstrap, unique("absent_verify"))
    assert rdkafka_state(absent)[0] == MISSING
    meta = _rdkafka_meta(kafka_bootstrap, topic)
    assert rdkafka_state(meta) == (READY, "")
    meta.error = KafkaError(KafkaError.LEADER_NOT_AVAILABLE)
    state, said = rdkafka_state(meta)
    assert state == TRANSIENT and "LEADER_NOT_AVAILABLE" in said
    meta.error = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert rdkafka_state(meta)[0] == REFUSED
    meta.error = None
    meta.partitions[1].error = KafkaError(KafkaError.LEADER_NOT_AVAILABLE)
    assert rdkafka_state(meta)[0] == TRANSIENT
    meta.partitions[1].error, meta.partitions[1].leader = None, -1
    assert rdkafka_state(meta) == (TRANSIENT, "partition 1 has no leader")
    assert rdkafka_state(None)[0] == TRANSIENT


def test_kafka_python_only_unknown_topic_is_missing(kafka_bootstrap, topic):
    from kafka import KafkaAdminClient
    from kafka.errors import (LeaderNotAvailableError, NotLeaderForPartitionError,
                              UnknownTopicOrPartitionError)

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        absent = admin.describe_topics([unique("absent_verify")])[0]
        assert absent["error_code"] == UnknownTopicOrPartitionError.errno
        assert kafka_python_state(absent)[0] == MISSING
        deadline = time.monotonic() + 120
        while True:
            found = admin.describe_topics([topic])[0]
            if kafka_python_state(found)[0] == READY or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert kafka_python_state(found) == (READY, "")
    finally:
        admin.close()
    found["error_code"] = LeaderNotAvailableError.errno
    assert kafka_python_state(found) == (TRANSIENT, "LeaderNotAvailableError")
    found["error_code"] = 0
    found["partitions"][0]["error_code"] = NotLeaderForPartitionError.errno
    assert kafka_python_state(found)[0] == TRANSIENT
    found["partitions"][0]["error_code"], found["partitions"][0]["leader_id"] = 0, -1
    assert kafka_python_state(found)[0] == TRANSIENT
    assert kafka_python_state(None)[0] == TRANSIENT


def test_transient_is_asked_again_then_unavailable():
    answers = iter([(TRANSIENT, "LEADER_NOT_AVAILABLE", None)] * 3 + [(READY, "", "meta")])
    naps = []
    assert await_topic(lambda: next(answers), "t", "k:9092", 60, naps.append) == "meta"
    assert len(naps) == 3
    with pytest.raises(SinkUnavailable) as lasting:  # past the deadline: unavailable
        await_topic(lambda: (TRANSIENT, "LEADER_NOT_AVAILABLE: Broker: Leader not available",
                             None), "orders", "k:9092", 0, naps.append)
    line = str(lasting.value)
    assert "'orders'" in line and "LEADER_NOT_AVAILABLE" in line
    assert "does not exist" not in line
    with pytest.raises(SinkError, match="does not exist"):
        await_topic(lambda: (MISSING, "UNKNOWN_TOPIC_OR_PART", None), "t", "k", 60, naps.append,
                    confirm=0)
    # unknown for a moment, then there (a topic made a moment ago): no verdict of "missing"
    answers = iter([(MISSING, "UNKNOWN_TOPIC_OR_PART", None)] * 2 + [(READY, "", "meta")])
    assert await_topic(lambda: next(answers), "t", "k", 60, naps.append) == "meta"


@pytest.mark.parametrize("library", [LIBRDKAFKA, KAFKA_PYTHON])
def test_fold_of_a_deleted_topic_says_it_does_not_exist(kafka_bootstrap, library):
    name = unique("absent_verify")
    with pytest.raises(SinkError, match=f"topic '{name}' does not exist") as missing:
        fold_topic(kafka_bootstrap, {}, name, TopicFold(1 << 70), Decoder(None),
                   library=library, timeout=30)
    assert not isinstance(missing.value, SinkUnavailable)


@pytest.mark.parametrize("library", [LIBRDKAFKA, KAFKA_PYTHON])
def test_fold_of_topics_made_a_moment_ago(kafka_bootstrap, library):
    """Right after its creation a topic is unknown to the broker for a few milliseconds,
    then its partitions' leader refuses offsets requests (NOT_LEADER_FOR_PARTITION): read
    at once, each fresh topic is read (empty), not "does not exist" nor unavailable (the old
    code said one or the other for most of them)."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = [unique("verify_fresh") for _ in range(10)]
    try:
        for name in names:
            admin.create_topics([NewTopic(name, 2, 1)])[name].result(60)
            assert fold_topic(kafka_bootstrap, {}, name, TopicFold(1 << 70), Decoder(None),
                              library=library, timeout=60) == 0
    finally:
        for future in admin.delete_topics(names).values():
            try:
                future.result(60)
            except Exception:  # noqa: BLE001 — a name the loop did not get to make
                pass
