"""Whether a route's topic is there to be read by ``pgrouter verify`` (``actors.verify.topic``).

Rules:

* Only Kafka's "unknown topic or partition" (librdkafka's ``UNKNOWN_TOPIC_OR_PART`` or its
  local ``_UNKNOWN_TOPIC``, kafka-python's ``UnknownTopicOrPartitionError``), in every
  answer for ``CONFIRM_MISSING`` seconds, means the topic does not exist: verify then says
  so, and the route's records are gone.
* A topic refused for good (not authorized, an invalid name) is a ``SinkError`` naming the
  topic and Kafka's error, at once.
* Anything else in the metadata (``LEADER_NOT_AVAILABLE`` right after the topic's creation
  or a broker's restart, a partition without a leader, no metadata for the topic at all),
  and a partition's offsets refused (``NOT_LEADER_FOR_PARTITION``: a leader named that does
  not lead yet) is transient: asked again until ``timeout`` seconds have passed, then ``SinkUnavailable``
  naming the topic and what Kafka said — never "does not exist", which would be a wrong
  verdict on a topic that holds the route's records.
"""

from __future__ import annotations

import time

from router.errors import SinkError, SinkUnavailable

READY, MISSING, TRANSIENT, REFUSED = "ready", "missing", "transient", "refused"
#: seconds a topic must stay unknown to Kafka before verify says it does not exist: a broker
#: answers UNKNOWN_TOPIC_OR_PART for a few milliseconds after the topic's creation, until
#: the controller's record of it reaches the broker
CONFIRM_MISSING = 2.0


def rdkafka_state(meta) -> tuple[str, str]:
    """``(state, what Kafka said)`` of confluent-kafka's ``TopicMetadata`` (None: the topic
    is not in the answer)."""
    from confluent_kafka import KafkaError

    if meta is None:
        return TRANSIENT, "no metadata for the topic in Kafka's answer"
    err = meta.error
    if err is not None:
        code = err.code()
        if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            return MISSING, err.name()
        if code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.TOPIC_EXCEPTION):
            return REFUSED, f"{err.name()}: {err.str()}"
        return TRANSIENT, f"{err.name()}: {err.str()}"
    if not meta.partitions:
        return TRANSIENT, "no partitions in Kafka's answer"
    for p in sorted(meta.partitions):
        part = meta.partitions[p]
        if part.error is not None:
            return TRANSIENT, f"partition {p}: {part.error.name()}: {part.error.str()}"
        if part.leader < 0:
            return TRANSIENT, f"partition {p} has no leader"
    return READY, ""


def rdkafka_marks(consumer, topic: str, timeout: float):
    """``look`` for ``await_topic`` through confluent-kafka's ``consumer``: the topic's
    metadata, then each partition's first and end offsets (``{partition: (first, end)}``).
    An offsets request refused by the partition's broker is transient too (a topic made a
    moment ago: its metadata name a leader that does not lead yet, NOT_LEADER_FOR_PARTITION);
    the next look asks the metadata again, which says whether the topic is gone."""
    from confluent_kafka import KafkaException, TopicPartition

    meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
    state, said = rdkafka_state(meta)
    if state != READY:
        return state, said, None
    marks = {}
    for p in sorted(meta.partitions):
        try:
            marks[p] = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                      timeout=timeout)
        except KafkaException as exc:
            err = exc.args[0]
            return TRANSIENT, f"partition {p}'s offsets: {err.name()}: {err.str()}", None
    return READY, "", marks


def kafka_python_state(described: dict | None) -> tuple[str, str]:
    """As ``rdkafka_state`` for one topic of kafka-python's ``describe_topics`` (a dict with
    ``error_code`` and ``partitions``; None: the topic is not in the answer)."""
    from kafka import errors

    if described is None:
        return TRANSIENT, "no metadata for the topic in Kafka's answer"
    error = errors.for_code(described.get("error_code") or 0)
    if error is errors.UnknownTopicOrPartitionError:
        return MISSING, error.__name__
    if error in (errors.TopicAuthorizationFailedError, errors.InvalidTopicError):
        return REFUSED, error.__name__
    if error is not errors.NoError:
        return TRANSIENT, error.__name__
    parts = described.get("partitions") or []
    if not parts:
        return TRANSIENT, "no partitions in Kafka's answer"
    for p in sorted(parts, key=lambda d: d.get("partition_index", 0)):
        index = p.get("partition_index")
        perr = errors.for_code(p.get("error_code") or 0)
        if perr is not errors.NoError:
            return TRANSIENT, f"partition {index}: {perr.__name__}"
        if (p.get("leader_id") if p.get("leader_id") is not None else -1) < 0:
            return TRANSIENT, f"partition {index} has no leader"
    return READY, ""


def await_topic(look, topic: str, bootstrap_servers, timeout: float,
                sleep=time.sleep, confirm: float = CONFIRM_MISSING):
    """``look()`` -> ``(state, what Kafka said, answer)`` asked until the topic is ready
    (its ``answer`` returned); missing for ``confirm`` seconds, or refused: ``SinkError``;
    still transient after ``timeout`` seconds: ``SinkUnavailable`` naming the topic."""
    start = time.monotonic()
    deadline = start + timeout
    pause = 0.05
    while True:
        state, said, answer = look()
        if state == READY:
            return answer
        if state == MISSING and time.monotonic() + pause > min(start + confirm, deadline):
            raise SinkError(f"topic {topic!r} does not exist at {bootstrap_servers}: the "
                            "route's records are gone (deleted topic?)")
        if state == REFUSED:
            raise SinkError(f"kafka: topic {topic!r} cannot be read at {bootstrap_servers}: "
                            f"{said}")
        if time.monotonic() + pause > deadline:
            raise SinkUnavailable(f"kafka.bootstrap_servers: Kafka unavailable for topic "
                                  f"{topic!r} at {bootstrap_servers}: {said} (still after "
                                  f"{timeout:g} s)")
        sleep(pause)
        pause = min(pause * 2, 1.0)
