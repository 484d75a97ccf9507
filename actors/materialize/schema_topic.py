"""The schema topic read to its end by a Kafka consumer in the driver's JVM: the Kafka client
that Spark's Kafka source ships, with the job's ``[kafka] options`` (their ``kafka.`` prefix
removed, as the source does). A schema topic holds a handful of records, so no Spark job: a
fresh JVM would pay a job's planning and its task before the first micro-batch could start
(README "Throughput").

Rules: every partition is read from its beginning to the end offset it had when the read began
(the router has a schema acknowledged before any record naming it, so that end holds every
schema a record read before can name); records without a value are skipped; a schema topic
that does not exist reads as empty and is not created; a broker that does not answer within
``TIMEOUT_S`` stops the job with ``MaterializeError``.
"""

from __future__ import annotations

import time

from .settings import JobConfig, MaterializeError

TIMEOUT_S = 60


def read_schema_topic(spark, cfg: JobConfig, timeout_s: float = TIMEOUT_S) -> list[bytes]:
    """The values of the records of ``cfg.schema_topic``, partition by partition."""
    from py4j.protocol import Py4JJavaError

    jvm = spark._jvm
    props = jvm.java.util.Properties()
    for k, v in cfg.kafka_options.items():
        if k.startswith("kafka."):
            props.setProperty(k[len("kafka."):], str(v))
    props.setProperty("bootstrap.servers", cfg.bootstrap_servers)
    props.setProperty("enable.auto.commit", "false")
    props.setProperty("allow.auto.create.topics", "false")
    wait = jvm.java.time.Duration.ofMillis(int(timeout_s * 1000))
    raw = jvm.org.apache.kafka.common.serialization.ByteArrayDeserializer
    topic = cfg.schema_topic
    try:
        consumer = jvm.org.apache.kafka.clients.consumer.KafkaConsumer(props, raw(), raw())
    except Py4JJavaError as exc:
        raise MaterializeError(f"schema topic {topic!r}: cannot create a Kafka consumer: "
                               f"{_cause(exc)}") from None
    try:
        parts = consumer.partitionsFor(topic, wait)
        tps = jvm.java.util.ArrayList()
        for info in parts or []:
            tps.add(jvm.org.apache.kafka.common.TopicPartition(topic, info.partition()))
        if tps.isEmpty():
            return []
        consumer.assign(tps)
        consumer.seekToBeginning(tps)
        end = consumer.endOffsets(tps, wait)
        values: list[bytes] = []
        pending = [tp for tp in tps if consumer.position(tp, wait) < end.get(tp)]
        deadline = time.monotonic() + timeout_s
        poll = jvm.java.time.Duration.ofMillis(200)
        while pending:
            got = 0
            for record in consumer.poll(poll).iterator():
                got += 1
                value = record.value()
                if value:
                    values.append(bytes(value))
            pending = [tp for tp in pending if consumer.position(tp, wait) < end.get(tp)]
            if got:
                deadline = time.monotonic() + timeout_s
            elif pending and time.monotonic() > deadline:
                raise MaterializeError(f"schema topic {topic!r}: no records from "
                                       f"{cfg.bootstrap_servers} for {timeout_s:g}s before its "
                                       f"end ({len(pending)} partition(s) left)")
        return values
    except Py4JJavaError as exc:
        raise MaterializeError(f"schema topic {topic!r} on {cfg.bootstrap_servers}: "
                               f"{_cause(exc)}") from None
    finally:
        # no group, nothing to commit: a graceful close would wait for the fetch the consumer
        # sent ahead (up to fetch.max.wait.ms)
        consumer.close(jvm.java.time.Duration.ZERO)


def _cause(exc) -> str:
    """The Java exception's own message, without py4j's wrapping and stack trace."""
    java = getattr(exc, "java_exception", None)
    if java is None:
        return str(exc).splitlines()[0]
    return f"{java.getClass().getSimpleName()}: {java.getMessage()}"
