"""A three-node Kafka cluster loses the leader of the router's partition (``kill -9``) while
the router streams a steady load, and gets it back later.

The topic has replication factor 3 and ``min.insync.replicas = 2``: with the leader dead a
follower in sync takes over and acks=all writes go on. The router must go on by itself (its
process never exits), nothing committed may be lost, and ``confirmed_flush_lsn``, read every
~20 ms, must never pass what the brokers held at that moment (``guarantee``). The stall (the
longest gap between appended records around the kill) is printed.

The cluster runs under ``.devstack/cluster`` (``devstack.kafka_cluster``), beside the
shared stack whose PostgreSQL it uses.
"""

from __future__ import annotations

import time

import pytest

from devstack.kafka_cluster import KafkaCluster
from tests.e2e.guarantee import (TOPIC_CONFIGS, ConfirmSampler, Load, max_stall, topic_size,
                                 verify, wait_for)
from tests.helpers import ROOT, Pg, run_router, start_router, unique, write_config

pytestmark = pytest.mark.services

ROWS, BATCH, RATE = 4000, 10, 25  # 400 transactions at 25 a second: a steady ~16 s load
SCHEMA_TOPIC = "pgrouter.schemas"


@pytest.fixture(scope="module")
def cluster():
    kafka = KafkaCluster(ROOT / ".devstack" / "cluster", brokers=3)
    try:
        kafka.up()
    except Exception as exc:  # a missing service fails the run, it is never skipped
        kafka.down()
        pytest.fail(f"Kafka cluster could not be started: {exc}", pytrace=False)
    _create_topic(kafka.bootstrap, SCHEMA_TOPIC, {"cleanup.policy": "compact"})
    yield kafka
    kafka.down()


def _create_topic(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        admin.create_topics([NewTopic(topic, 1, 3, topic_configs=configs)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


def _delete_topic(bootstrap: str, topic: str) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        admin.delete_topics([topic])
    except Exception:
        pass
    finally:
        admin.close()


def _routes(name: str) -> str:
    conf = ", ".join(f'"{k}" = "{v}"' for k, v in
                     {**TOPIC_CONFIGS, "min.insync.replicas": "2"}.items())
    return (f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\ntopic = "{name}"\n'
            f"topic_settings = {{ partitions = 1, replication_factor = 3, "
            f"configs = {{ {conf} }} }}\n")


def test_partition_leader_killed_under_load(cluster, pg_dsn, tmp_path):
    bootstrap = cluster.bootstrap
    pg = Pg(pg_dsn)
    name = unique("leader")
    pg.run(f"create table {name} (id bigint primary key, batch int, payload text)")
    pg.run(f"create publication {name} for table {name}")
    pg.run("select pg_create_logical_replication_slot(%s, 'test_decoding')", f"{name}_oracle")
    cfg = write_config(tmp_path / "router.toml", dsn=pg_dsn, slot=name, publications=[name],
                       bootstrap=bootstrap, routes=_routes(name))
    proc = None
    try:
        run_router(cfg)  # the slot, before the load
        sampler = ConfirmSampler(pg_dsn, name)
        sampler.start()
        load = Load(pg_dsn, name, ROWS, rate=RATE, batch=BATCH)
        load.start()
        proc = start_router(cfg, tmp_path / "router.log")
        wait_for(lambda: topic_size(bootstrap, name) > 300, timeout=120,
                 what="records in Kafka before the kill")
        leader = cluster.leader(name)
        assert leader > 0 and load.running
        killed = time.time()
        cluster.kill9(leader)
        at_kill = topic_size(bootstrap, name)
        wait_for(lambda: topic_size(bootstrap, name) > at_kill + 100, timeout=120,
                 what="records written after the leader died")
        assert load.running, "the load finished before the stream resumed: raise ROWS"
        new_leader = cluster.leader(name)
        assert new_leader not in (leader, -1)
        cluster.start(leader)
        load.join(timeout=300)
        assert load.error is None, f"load failed: {load.error!r}"
        wait_for(lambda: pg.one("select confirmed_flush_lsn >= pg_current_wal_lsn() from "
                                "pg_replication_slots where slot_name = %s", name),
                 timeout=120, what="the router to catch up")
        assert proc.poll() is None, "the router must go on by itself after a leader change"
        proc.terminate()
        proc.wait(timeout=60)
        assert proc.returncode == 0, (tmp_path / "router.log").read_text()[-3000:]
        samples = sampler.stop()
        figures = verify(pg, bootstrap, name, f"{name}_oracle", samples, rows=ROWS)
        assert figures["checked"] > 50, figures
        stall = max_stall(figures["all"], killed - 1, killed + 60)
        print(f"leader {leader} killed: stream stalled {stall:.1f}s, new leader {new_leader}, "
              f"{figures['samples']} readings, {figures['duplicates']} duplicates")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        pg.drop_slot(name)
        pg.drop_slot(f"{name}_oracle")
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}")
        pg.close()
        _delete_topic(bootstrap, name)
