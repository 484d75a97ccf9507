"""The start-up checks ask Kafka with the library the router produces with
(``actors.kafka.admin``): both give the same findings against the real broker."""

from __future__ import annotations

import uuid

import pytest

from actors.kafka.admin import wait_led_kafka_python
from actors.services import preflight
from actors.services.preflight import Topic, kafka_findings


class _Kafka:
    def __init__(self, bootstrap, client):
        self.bootstrap_servers, self.client, self.settings = bootstrap, client, {}
        self.create_topics = True


class _Cfg:
    def __init__(self, bootstrap, client):
        self.kafka = _Kafka(bootstrap, client)


@pytest.fixture(scope="module")
def existing(kafka_bootstrap):
    from kafka.admin import KafkaAdminClient, NewTopic

    name = f"checks-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(name, 2, 1, topic_configs={"retention.ms": "60000"})])
    # served before the checks look for it: CreateTopics returns before every broker's
    # metadata has the topic, and a check that does not see it yet finds nothing to say
    wait_led_kafka_python(admin, {name: 2}, 30)
    try:
        yield name
    finally:
        admin.delete_topics([name])
        admin.close()


@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_both_libraries_find_the_same(kafka_bootstrap, existing, client, monkeypatch):
    imported = []
    real = preflight.kafka_admin
    monkeypatch.setattr(preflight, "kafka_admin", lambda cfg: imported.append(1) or real(cfg))
    fresh = f"checks-new-{uuid.uuid4().hex[:8]}"
    topics = [Topic(existing, "routes[0].topic_settings", 3, 1, {"retention.ms": "120000"}),
              Topic(fresh, "routes[1].topic_settings", 1, 7, {}),  # 7 replicas, 1 broker
              Topic(fresh + "-ok", "routes[2].topic_settings", 1, 1, {"cleanup.policy":
                                                                      "compact"})]
    found = kafka_findings(_Cfg(kafka_bootstrap, client), topics)
    lines = sorted((f.path, f.message.split(":")[0], f.warning) for f in found)
    assert lines == [
        ("routes[0].topic_settings", f"topic {existing!r} exists with 2 partitions, "
                                     "topic_settings say 3; retention.ms=60000, "
                                     "topic_settings say 120000 (pgrouter does not change "
                                     "existing topics)", True),
        ("routes[1].topic_settings", f"Kafka refuses topic {fresh!r}", False)], found
    # nothing was created (validate_only)
    from kafka.admin import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        assert not {fresh, fresh + "-ok"} & set(admin.list_topics())
    finally:
        admin.close()
    assert bool(imported) is (client == "kafka-python"), "asked with the other library"


@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_a_topic_made_since_it_was_looked_for_is_not_a_refusal(kafka_bootstrap, existing,
                                                               client):
    """Three routers starting at once: one looked for its topic, found none, and another
    made it before the first asked Kafka whether it would create it. Kafka's answer, "it
    exists", is no refusal (the late router stopped with "Kafka refuses topic …")."""
    admin = preflight._admin(_Cfg(kafka_bootstrap, client))
    assert admin.refusals([Topic(existing, "routes[0].topic_settings", 2, 1, {})]) == []
