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

from .rdkafka_conf import connection_conf  # noqa: F401  (the admin client's, re-exported)


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
