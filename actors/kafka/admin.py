"""What the start-up checks ask Kafka (``actors.services.preflight.kafka_findings``), through
the library the router produces with: ``RdKafkaAdmin`` (confluent-kafka's admin client) or
``KafkaPythonAdmin`` (kafka-python's). A router producing with librdkafka so never imports
kafka-python, which costs a tenth of a second at every start.

Both answer the same four questions: which of the named topics exist (only these are asked
about), the broker's verdict on topics to create (``validate_only``: nothing is created), and
the partitions and configs of existing topics. A request that fails raises; the caller turns
that into one line.
"""

from __future__ import annotations

import time

from .rdkafka_conf import connection_conf  # noqa: F401  (the admin client's, re-exported)

LED_POLL = 0.01  # seconds between the questions of ``wait_led``
#: librdkafka's answers while no leader serves a partition just created yet: no leader in
#: the metadata (_NOENT, _UNKNOWN_TOPIC, _UNKNOWN_PARTITION), or the broker's
#: UNKNOWN_TOPIC_OR_PART, LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH,
#: UNKNOWN_LEADER_EPOCH (the client's metadata names an epoch the leader does not serve yet)
_NOT_LED_YET = frozenset({-156, -188, -190, 3, 5, 6, 74, 75})


def held(admin, names, timeout: float) -> dict[str, int]:
    """The partition counts of those of ``names`` Kafka holds and shows this client, asked
    of these only (a cluster's full list costs a start tens of milliseconds per thousand
    topics) by DescribeTopics through ``admin`` (confluent-kafka's): a producer's metadata
    request would have the broker create a topic it lacks (``auto.create.topics.enable``).
    A topic the client may not describe is left out, as a full listing leaves it out."""
    from confluent_kafka import KafkaError, KafkaException, TopicCollection

    names = list(dict.fromkeys(names))  # DescribeTopics refuses a name twice
    if not names:
        return {}
    found = {}
    for name, future in admin.describe_topics(TopicCollection(names),
                                              request_timeout=timeout).items():
        try:
            found[name] = len(future.result(timeout=timeout * 2).partitions)
        except KafkaException as exc:
            if exc.args[0].code() not in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                          KafkaError.TOPIC_AUTHORIZATION_FAILED):
                raise
    return found


def wait_led(admin, partitions: dict[str, int], timeout: float) -> None:
    """Return once the leader of every partition of ``partitions`` (topic -> partition count)
    answers a ListOffsets for it, through ``admin`` (confluent-kafka's); ``TimeoutError`` after
    ``timeout`` seconds. A topic just created is written to only then: CreateTopics returns
    once the controller made it, before its leader serves it, and an idempotent producer's
    first request that the leader refuses meanwhile (NOT_LEADER_OR_FOLLOWER) while the next
    one is already on its way loses its records silently: the broker takes the next
    request's sequence as the first of an empty partition, the retry is out of order
    (KAFKA-15591, fixed in Kafka 4.5). A topic found, not made, is asked about too: made by
    someone else a moment ago, it is as new. The partitions are asked about in one question
    (topics already served cost one round trip); the client's metadata of those not served
    yet is refreshed before each next question."""
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    left = {(t, p) for t, n in partitions.items() for p in range(n)}
    deadline = time.monotonic() + timeout
    while left:
        futures = admin.list_offsets({TopicPartition(t, p): OffsetSpec.latest()
                                      for t, p in sorted(left)}, request_timeout=timeout)
        for tp, future in futures.items():
            try:
                future.result(timeout=timeout * 2)
                left.discard((tp.topic, tp.partition))
            except KafkaException as exc:
                if not (exc.args[0].retriable() or exc.args[0].code() in _NOT_LED_YET):
                    raise
        if not left:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"no leader serves {sorted(left)} yet")
        time.sleep(LED_POLL)
        for topic in sorted({t for t, _ in left}):  # the client's metadata of it, fresh
            admin.list_topics(topic, timeout=timeout)


def wait_led_kafka_python(admin, partitions: dict[str, int], timeout: float) -> None:
    """``wait_led`` through kafka-python's admin client (it asks again itself while a
    partition's leader is not known yet)."""
    import kafka.errors as kerr
    from kafka import TopicPartition
    from kafka.admin import OffsetSpec

    specs = {TopicPartition(t, p): OffsetSpec.LATEST
             for t, n in partitions.items() for p in range(n)}
    deadline = time.monotonic() + timeout
    while specs:
        try:
            admin.list_partition_offsets(specs, timeout_ms=int(timeout * 1000))
            return
        except (kerr.UnknownTopicOrPartitionError, kerr.NotLeaderForPartitionError,
                kerr.LeaderNotAvailableError, kerr.FencedLeaderEpochError,
                kerr.UnknownLeaderEpochError) as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no leader serves {sorted(partitions)} yet") from exc
        time.sleep(LED_POLL)


class RdKafkaAdmin:
    def __init__(self, bootstrap_servers, settings: dict, timeout: float):
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient(connection_conf(bootstrap_servers, settings))
        self.timeout = timeout
        self._partitions: dict[str, int] = {}

    def topics(self, names) -> set[str]:
        self._partitions = held(self.admin, names, self.timeout)
        return set(self._partitions)

    def refusals(self, topics) -> list[tuple[str, str]]:
        """(name, the broker's reason) of each topic it would refuse to create."""
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import NewTopic

        futures = self.admin.create_topics(
            [NewTopic(t.name, num_partitions=t.partitions,
                      replication_factor=t.replication_factor,
                      config={k: str(v) for k, v in t.configs.items()}) for t in topics],
            validate_only=True, request_timeout=self.timeout)
        out = []
        for name, future in futures.items():
            try:
                future.result(timeout=self.timeout * 2)
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue  # made since it was looked for (a second router starting)
                out.append((name, err.str() if hasattr(err, "str") else str(err)))
        return out

    def partitions(self, names) -> dict[str, int]:
        return {n: self._partitions[n] for n in names if n in self._partitions}

    def configs(self, names) -> dict[str, dict[str, str | None]]:
        from confluent_kafka.admin import ConfigResource

        futures = self.admin.describe_configs([ConfigResource("topic", n) for n in names],
                                              request_timeout=self.timeout)
        return {resource.name: {k: e.value for k, e in future.result(self.timeout * 2).items()}
                for resource, future in futures.items()}

    def close(self) -> None:
        self.admin = None


class KafkaPythonAdmin:
    def __init__(self, admin):
        self.admin = admin  # a kafka-python KafkaAdminClient

    def topics(self, names) -> set[str]:
        return set(self.admin.list_topics()).intersection(names)

    def refusals(self, topics) -> list[tuple[str, str]]:
        """As ``RdKafkaAdmin.refusals``: a topic made since it was looked for (a second router
        starting at the same moment) is no refusal."""
        from kafka.errors import TopicAlreadyExistsError

        reply = self.admin.create_topics(
            {t.name: {"num_partitions": t.partitions, "replication_factor": t.replication_factor,
                      "configs": dict(t.configs)} for t in topics},
            validate_only=True, raise_errors=False)
        return [(r["name"], r.get("error_message")) for r in reply.get("topics", [])
                if r.get("error_code") not in (None, 0, TopicAlreadyExistsError.errno)]

    def partitions(self, names) -> dict[str, int]:
        return {d["name"]: len(d.get("partitions") or ())
                for d in self.admin.describe_topics(list(names))}

    def configs(self, names) -> dict[str, dict[str, str | None]]:
        from kafka.admin import ConfigResource, ConfigResourceType

        found = self.admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, n) for n in names], config_filter="all")
        by_topic = found.get("topic", {}) if isinstance(found, dict) else {}
        return {name: {k: (v or {}).get("value") for k, v in entries.items()}
                for name, entries in by_topic.items()}

    def close(self) -> None:
        self.admin.close()
