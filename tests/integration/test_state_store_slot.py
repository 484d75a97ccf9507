"""The snapshot state topic is shared by every router of a cluster (``[snapshot]
state_topic``'s default): a router's ``StateStore`` holds its own slot's records only, read
from a topic that also holds other slots' — among them one whose route is named like this
router's slot, which a look at the key bytes alone would take — with both Kafka clients."""

from __future__ import annotations

import pytest

from actors.cli.config_file import load
from devstack.configs import toml
from actors.snapshot.store import StateStore
from router.snapshot.core import SnapshotState, encode_state
from tests.helpers import unique

pytestmark = pytest.mark.services


def _config(tmp_path, bootstrap: str, slot: str, topic: str, client: str):
    path = tmp_path / "router.toml"
    path.write_text(toml({
        "source": {"dsn": "postgresql://postgres@127.0.0.1:5432/postgres", "slot": slot,
                   "publications": ["p"]},
        "kafka": {"bootstrap_servers": bootstrap, "client": client, "create_topics": False},
        "snapshot": {"state_topic": topic},
        "routes": [{"name": "r", "tables": ["public.t"]}]}))
    return load(str(path), "run")


@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_a_store_holds_its_own_slots_records(kafka_bootstrap, tmp_path, client):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    mine, other = unique("sts"), unique("sts")
    topic = unique("sts_state")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[
        topic].result(60)
    states = [
        SnapshotState("initial", mine, "started", request="a"),
        SnapshotState("initial", other, "done", request="b"),
        SnapshotState("backfill", other, "running", route=mine, table="public.t"),
        SnapshotState("backfill", mine, "running", route="r", table="public.t"),
        SnapshotState("signal", other, "queued", request=mine, route="r"),
        SnapshotState("initial", mine, "done", request="a"),  # the last of its key wins
    ]
    try:
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        failed: list = []
        for p in states:
            key, value = encode_state(p)
            producer.produce(topic, value, key,
                             on_delivery=lambda err, _m: err and failed.append(err))
        assert producer.flush(60) == 0 and not failed, failed
        store = StateStore(_config(tmp_path, kafka_bootstrap, mine, topic, client), None, mine)
        got = store.load()
        assert sorted((p.kind, p.slot, p.state) for p in got.values()) == [
            ("backfill", mine, "running"), ("initial", mine, "done")]
        assert store.get(SnapshotState("initial", mine, "")).state == "done"
        assert store.get(SnapshotState("initial", other, "")) is None
    finally:
        admin.delete_topics([topic])[topic].result(60)
