"""A breaker's '.'/'_' twins of outbox topics that the start's list of Kafka's topics does not
hold, read by a plain consumer: a twin another tool made while the router streams, and the
route's own dead-letter topic. Each colliding event is a dead letter naming both topics and
the router streams on (it exited with Kafka's 'TOPIC_EXCEPTION ... collides' line, dead_letter
or not, and in the dead-letter case at every start). Read by a read_committed consumer: each
once, under exactly-once too."""

from __future__ import annotations

import time

import pytest

from tests.e2e.guarantee import delete_topics
from tests.helpers import Pg, read_topic, start_router, stop_router, unique, wait_line, \
    write_config

pytestmark = pytest.mark.services


def _topics(bootstrap: str, name: str) -> list[str]:
    from kafka import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="t")
    try:
        return sorted(t for t in admin.list_topics() if name in t)
    finally:
        admin.close()


def _committed(bootstrap: str, topic: str) -> list[tuple]:
    """(id, pgrouter.error) of the records of ``topic`` a read_committed consumer reads."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("twins"),
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, low)])
        out, position = [], low
        while position < high:  # the last stable offset: markers and aborted ones skipped
            msg = consumer.poll(5)
            if msg is None:
                break
            if not msg.error():
                headers = dict(msg.headers() or [])
                out.append((headers["id"], headers.get("pgrouter.error")))
                position = msg.offset() + 1
        return out
    finally:
        consumer.close()


def _ids(bootstrap: str, topic: str, count: int, proc, log) -> list[tuple]:
    import time
    for _ in range(60):
        assert proc.poll() is None, log.read_text()[-3000:]  # the router stopped
        if topic in _topics(bootstrap, topic):
            got = _committed(bootstrap, topic)
            if len(got) >= count:
                return got
        time.sleep(1)
    raise AssertionError(f"{topic}: fewer than {count} records\n{log.read_text()[-3000:]}")


@pytest.mark.parametrize("case", ["made-by-another-tool", "dead-letter-first", "event-first"])
@pytest.mark.parametrize("client", ["librdkafka", "kafka-python", "exactly-once"])
def test_a_twin_unknown_at_the_start_is_a_dead_letter(pg_dsn, kafka_bootstrap, tmp_path,
                                                      case, client):
    """Each event and dead letter once (read_committed; exactly-once: the restart aborts the
    open Kafka transaction, none twice)."""
    pg = Pg(pg_dsn)
    name = unique("obxt")
    pg.run(f"create table {name} (id serial primary key, aggregatetype text, "
           "aggregateid text, payload jsonb)")
    pg.run(f"create publication {name} for table {name}")
    dead = f"{name}_dead"
    kafka = (f'client = "{client}"\n' if client != "exactly-once" else
             'client = "librdkafka"\nexactly_once = true\n'
             f'committed_lsn_topic = "{name}.progress"\n')
    cfg = write_config(tmp_path / "r.toml", dsn=pg_dsn, slot=name, publications=[name],
                       bootstrap=kafka_bootstrap, kafka_extra=kafka,
                       routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                              f'[routes.outbox]\ntopic = "{name}.{{aggregatetype}}"\n'
                              f'dead_letter = "{dead}"\n')
    log = tmp_path / "router.log"

    def insert(kind: str | None) -> None:
        pg.run(f"insert into {name} (aggregatetype, aggregateid, payload) values "
               f"({'null' if kind is None else repr(kind)}, 'k', '1')")
    proc = start_router(cfg, log)
    try:
        wait_line("streaming started", log, proc)
        if case == "made-by-another-tool":
            from kafka import KafkaAdminClient
            from kafka.admin import NewTopic
            admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="t")
            try:
                admin.create_topics([NewTopic(f"{name}.a.b", 1, 1)])
            finally:
                admin.close()
            kinds = ["a_b", "ok", None]  # 1 collides, 2 an event, 3 a dead letter
        elif case == "dead-letter-first":
            kinds = [None, "dead", "ok"]
        else:
            kinds = ["dead", None, "ok"]
        for kind in kinds:
            insert(kind)
        events = _ids(kafka_bootstrap, f"{name}.ok", 1, proc, log)
        letters = _ids(kafka_bootstrap, dead, 2, proc, log)
        assert proc.poll() is None, log.read_text()[-3000:]
        ok = str(kinds.index("ok") + 1).encode()
        time.sleep(3)  # a second copy would be there by now
        events = _committed(kafka_bootstrap, f"{name}.ok")
        letters = _committed(kafka_bootstrap, dead)
        assert [i for i, _ in events] == [ok]
        assert sorted(i for i, _ in letters) == sorted(
            str(n + 1).encode() for n, k in enumerate(kinds) if k != "ok")
        twin = [why.decode() for _, why in letters if b"differ only" in why]
        assert len(twin) == 1, letters
        assert set(_topics(kafka_bootstrap, name)) <= {
            f"{name}.ok", dead, f"{name}.a.b", f"{name}.progress"}, _topics(kafka_bootstrap, name)
        assert "Traceback" not in log.read_text()
    finally:
        stop_router(proc)
        pg.drop_slot(name)
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}")
        pg.close()
        delete_topics(kafka_bootstrap, _topics(kafka_bootstrap, name))
