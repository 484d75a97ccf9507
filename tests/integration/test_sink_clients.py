"""Both Kafka clients against the dev stack's real Kafka: one delivery contract.

* a record is reported once, and only with what the broker assigned on acknowledgement
  (its offset), and it is then readable from the topic with its key, value and headers;
* reports arrive by themselves when the client is otherwise idle (no flush needed);
* failures are typed: a record above the topic's ``max.message.bytes`` → ``RecordTooLarge``,
  an unreachable bootstrap → ``SinkUnavailable``; bad ``[kafka] settings`` → ``ConfigError``
  naming the key;
* the same key lands on the same partition with either client (and where Kafka's own
  murmur2 partitioner puts it), and ``pgrouter run`` writes the same records either way.
* "librdkafka-packed" is librdkafka's client handed its records packed, as an initial
  snapshot hands them (``router.snapshot.rows.PackedRecords``): its second producer, driven
  from C (``actors.kafka.native_producer``), keeps the same contract.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import uuid

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.partitioner.default import murmur2 as kafka_murmur2

from actors.kafka.kafka_python import KafkaPythonClient, murmur2
from actors.kafka.librdkafka import RdKafkaClient
from router.snapshot.rows import PackedRecords, RecordBlock
from router.routing.topics import TopicSpec
from router.errors import ConfigError, RecordTooLarge, SinkError, SinkUnavailable
from tests.helpers import Pg, run_router, unique, write_config
from tests.helpers import read_topic as read_records

pytestmark = pytest.mark.services

def pack(records: list) -> PackedRecords:
    """``(topic, key, value, headers)`` records as an initial snapshot packs them: a block
    per run of one topic, headers ``[lsn header, (seq name, seq)]`` numbered on, or none."""
    blocks: list[RecordBlock] = []
    run: list = []
    for r in records + [None]:
        if run and (r is None or r[0] != run[0][0]):
            data, offsets = bytearray(), bytearray()
            for _, key, value, _ in run:
                start = len(data)
                data += key
                offsets += struct.pack("qqq", start, len(data), len(data) + len(value))
                data += value
            headers = run[0][3]
            lsn, seq = (headers[0], headers[1]) if headers else (None, ("pgrouter.seq", b"0"))
            block = RecordBlock(run[0][0], bytes(data), bytes(offsets), lsn, seq[0],
                                int(seq[1]))
            assert list(block) == [(t, k, v, h or None) for t, k, v, h in run]
            blocks.append(block)
            run = []
        if r is not None:
            run.append(r)
    return PackedRecords(blocks)


class PackedRdKafkaClient(RdKafkaClient):
    """librdkafka's client handed its records packed (its C-driven producer)."""

    def produce(self, records, ticket, on_done) -> None:
        assert self.takes_packed
        return super().produce(pack(records), ticket, on_done)


CLIENTS = {"kafka-python": KafkaPythonClient, "librdkafka": RdKafkaClient,
           "librdkafka-packed": PackedRdKafkaClient}
DEADLINE = 30.0


@pytest.fixture(params=sorted(CLIENTS))
def client_name(request) -> str:
    return request.param


@pytest.fixture
def topics(kafka_bootstrap):
    """Names of topics a test creates; deleted afterwards."""
    made: list[str] = []
    yield made
    if made:
        admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="pgrouter-test")
        try:
            admin.delete_topics([t for t in made if t in set(admin.list_topics())])
        finally:
            admin.close()


def new_topic(topics: list[str], prefix: str) -> str:
    name = f"test.sink.{prefix}.{uuid.uuid4().hex[:10]}"
    topics.append(name)
    return name


class Reports:
    """Collects ``on_done(ticket, error, count)`` calls (from the client's thread)."""

    def __init__(self, expected: int):
        self.expected = expected  # records
        self.calls: list[tuple[int, object, int, str]] = []
        self._lock = threading.Lock()
        self.done = threading.Event()

    def __call__(self, ticket, error, count) -> None:
        with self._lock:
            self.calls.append((ticket, error, count, threading.current_thread().name))
            if error is not None or sum(c[2] for c in self.calls) >= self.expected:
                self.done.set()

    def wait(self, timeout: float = DEADLINE) -> None:
        assert self.done.wait(timeout), f"{self.calls} for {self.expected} records"

    @property
    def error(self):
        errors = [c[1] for c in self.calls if c[1] is not None]
        return errors[0] if errors else None


def failure(exc_or_result, client) -> SinkError:
    assert isinstance(exc_or_result, BaseException), exc_or_result
    return client.map_error(exc_or_result)


def read_topic(bootstrap: str, topic: str, partitions: int, count: int) -> list:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=2000)
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        out: list = []
        deadline = time.monotonic() + DEADLINE
        while len(out) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                out.extend(batch)
        return out
    finally:
        consumer.close()


def test_reports_only_acknowledged_records_once_each(client_name, kafka_bootstrap, topics):
    client = CLIENTS[client_name](kafka_bootstrap, {})
    try:
        topic = new_topic(topics, "ack")
        client.ensure_topics([TopicSpec(topic, 3, 1)])
        client.ensure_topics([TopicSpec(topic, 3, 1)])  # idempotent
        records = [(topic, b'{"id":%d}' % i, b'{"op":"c","n":%d}' % i,
                    [("pgrouter.commit_lsn", b"42"), ("pgrouter.seq", b"%d" % i)])
                   for i in range(300)]
        reports = Reports(len(records))
        client.produce(records[:150], 7, reports)
        client.produce(records[150:], 8, reports)
        reports.wait()
        time.sleep(0.3)  # a second report for any batch would show up here
        # one report per batch, with its record count, once every record is acknowledged
        assert sorted((t, e, c) for t, e, c, _ in reports.calls) == [(7, None, 150),
                                                                     (8, None, 150)]
        # reports come from the client's own thread, never the caller's
        assert threading.current_thread().name not in {n for _, _, _, n in reports.calls}
        # what was reported is in the topic, each record once, with key, value and headers
        got = read_topic(kafka_bootstrap, topic, 3, len(records))
        assert len({(m.partition, m.offset) for m in got}) == len(records)
        assert sorted((m.key, m.value, list(m.headers)) for m in got) == \
            sorted((k, v, h) for _, k, v, h in records)
    finally:
        client.close(10.0)


def test_reports_arrive_when_idle(client_name, kafka_bootstrap, topics):
    client = CLIENTS[client_name](kafka_bootstrap, {})
    try:
        topic = new_topic(topics, "idle")
        client.ensure_topics([TopicSpec(topic)])
        client.produce_sync(topic, b"null", b"{}")  # connections and producer id ready
        reports = Reports(1)
        client.produce([(topic, b'{"id":1}', b"{}", [])], 1, reports)
        reports.wait(5.0)  # nobody calls flush: the client delivers its reports by itself
        assert [(t, e, c) for t, e, c, _ in reports.calls] == [(1, None, 1)]
    finally:
        client.close(10.0)


def test_ensure_topics_makes_its_own_topics_on_a_broker_that_auto_creates(
        client_name, kafka_bootstrap, topics):
    """Asking which of the topics exist must not make them: the dev broker creates a topic a
    producer's metadata request names (``auto.create.topics.enable``), with one partition and
    its own configs. A topic that exists keeps its partitions."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    held, made = new_topic(topics, "held"), new_topic(topics, "made")
    first = CLIENTS[client_name](kafka_bootstrap, {})
    try:
        first.ensure_topics([TopicSpec(held, 2, 1)])
    finally:
        first.close(10.0)
    client = CLIENTS[client_name](kafka_bootstrap, {})  # knows neither topic
    try:
        client.ensure_topics([TopicSpec(made, 3, 1, {"cleanup.policy": "compact"}),
                              TopicSpec(held, 5, 1)])
    finally:
        client.close(10.0)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    meta = admin.list_topics(timeout=DEADLINE).topics
    assert (len(meta[made].partitions), len(meta[held].partitions)) == (3, 2)
    [future] = admin.describe_configs([ConfigResource("topic", made)]).values()
    assert future.result(DEADLINE)["cleanup.policy"].value == "compact"


def test_record_too_large_for_topic(client_name, kafka_bootstrap, topics):
    client = CLIENTS[client_name](kafka_bootstrap, {"delivery_timeout_ms": 20_000,
                                                  "request_timeout_ms": 10_000})
    try:
        topic = new_topic(topics, "large")
        client.ensure_topics([TopicSpec(topic, 1, 1, {"max.message.bytes": "2048"})])
        client.produce_sync(topic, b"null", b"{}")
        with pytest.raises(RecordTooLarge):
            client.produce_sync(topic, b"null", b"x" * 20_000, timeout=DEADLINE)
        _assert_too_large(client, [(topic, b"null", b"y" * 20_000, [])], 3)
    finally:
        client.close(5.0)


def _assert_too_large(client, records: list, ticket: int) -> None:
    """``records`` handed over fail as RecordTooLarge: refused before sending (also typed) or
    reported failed."""
    reports = Reports(1)
    try:
        client.produce(records, ticket, reports)
    except SinkError as exc:
        assert isinstance(exc, RecordTooLarge)
    else:
        reports.wait()
        assert isinstance(failure(reports.error, client), RecordTooLarge)


def test_record_too_large_for_client(client_name, kafka_bootstrap, topics):
    client = CLIENTS[client_name](kafka_bootstrap, {"max_request_size": 4096})
    try:
        topic = new_topic(topics, "limit")
        client.ensure_topics([TopicSpec(topic)])
        _assert_too_large(client, [(topic, b"null", b"z" * 10_000, [])], 1)
    finally:
        client.close(5.0)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_unreachable_bootstrap_is_sink_unavailable(client_name):
    settings = {"request_timeout_ms": 2000, "delivery_timeout_ms": 4000, "linger_ms": 5}
    start = time.monotonic()
    with pytest.raises(SinkUnavailable):
        client = CLIENTS[client_name](f"127.0.0.1:{_closed_port()}", settings)
        try:
            client.produce_sync("test.sink.unreachable", b"null", b"{}", timeout=DEADLINE)
        finally:
            client.close(1.0)
    assert time.monotonic() - start < DEADLINE


def test_packed_records_to_an_unreachable_broker_fail_typed():
    """The C-driven producer reports records it could not deliver as failed (never as
    acknowledged), typed as the sink expects."""
    client = PackedRdKafkaClient(f"127.0.0.1:{_closed_port()}",
                                 {"request_timeout_ms": 2000, "delivery_timeout_ms": 3000})
    try:
        reports = Reports(2)
        client.produce([("test.sink.unreachable", b"null", b"{}", None)] * 2, 4, reports)
        reports.wait()
        assert [(t, c) for t, _, c, _ in reports.calls] == [(4, 0)]
        assert isinstance(failure(reports.error, client), SinkUnavailable)
    finally:
        client.close(1.0)


@pytest.mark.parametrize("settings, key", [
    ({"lingerms": 5}, "lingerms"),
    ({"linger_ms": "5"}, "linger_ms"),
    ({"compression_type": "brotli"}, "compression_type"),
    ({"acks": "1"}, "acks"),
])
def test_bad_settings_name_the_key(client_name, settings, key):
    with pytest.raises(ConfigError) as info:
        CLIENTS[client_name]("127.0.0.1:1", settings)
    assert info.value.path == f"kafka.settings.{key}"


def test_librdkafka_only_setting_is_refused_by_kafka_python():
    with pytest.raises(ConfigError) as info:
        KafkaPythonClient("127.0.0.1:1", {"batch_num_messages": 100})
    assert info.value.path == "kafka.settings.batch_num_messages"


def test_same_key_same_partition_with_both_clients(kafka_bootstrap, topics):
    keys = [b'{"id":%d}' % i for i in range(1000)] + [b"null", b'{"code":"\\u00e9"}']
    placed: dict[str, dict[bytes, int]] = {}
    for name, cls in CLIENTS.items():
        client = cls(kafka_bootstrap, {})
        try:
            topic = new_topic(topics, "keys")
            client.ensure_topics([TopicSpec(topic, 6, 1)])
            reports = Reports(len(keys))
            client.produce([(topic, k, b"{}", []) for k in keys], 0, reports)
            reports.wait()
            by_offset = {}
            assert reports.error is None, reports.error
            # reports do not name the key: read the records back
            for m in read_topic(kafka_bootstrap, topic, 6, len(keys)):
                by_offset[m.key] = m.partition
            placed[name] = by_offset
        finally:
            client.close(10.0)
    assert len(placed["kafka-python"]) == len(keys)
    assert placed["kafka-python"] == placed["librdkafka"] == placed["librdkafka-packed"]
    # …and where Kafka's default (Java) partitioner puts them
    assert all(p == (kafka_murmur2(k) & 0x7FFFFFFF) % 6 for k, p in placed["librdkafka"].items())
    assert len(set(placed["librdkafka"].values())) == 6


def test_murmur2_matches_kafkas():
    import random
    rng = random.Random(8)
    for n in range(0, 70):
        data = bytes(rng.getrandbits(8) for _ in range(n))
        assert murmur2(data) == kafka_murmur2(data)


def test_pipeline_writes_the_same_records_with_either_client(pg_dsn, kafka_bootstrap,
                                                             tmp_path, topics):
    """``pgrouter run`` with ``client = "librdkafka"`` and with kafka-python, each from its
    own slot over the same changes: the same records (bar ``source.route``) on the same
    partitions, in the same order per partition."""
    pg = Pg(pg_dsn)
    name = unique("sinkcl")
    schema_topic = new_topic(topics, "schemas")
    pg.run(f"create table {name} (id bigint primary key, v text, n int)")
    pg.run(f"create publication {name} for table {name}")
    configs = {}
    try:
        for client in ("kafka-python", "librdkafka"):  # the [kafka] client values
            route = f"{name}_{client.replace('-', '_')}"
            topics.append(route)
            configs[client] = write_config(
                tmp_path / f"{client}.toml", dsn=pg_dsn, slot=route, publications=[name],
                bootstrap=kafka_bootstrap,
                kafka_extra=f'client = "{client}"\nschema_topic = "{schema_topic}"',
                routes=f'[[routes]]\nname = "{route}"\ntables = ["public.{name}"]\n'
                       f'topic = "{route}"\ntopic_settings = {{ partitions = 3 }}\n')
            run_router(configs[client])  # creates the slot before the changes
        pg.run(f"insert into {name} select g, 'v' || g, g from generate_series(1, 60) g")
        pg.run(f"update {name} set v = v || '!' where id % 6 = 0")
        pg.run(f"delete from {name} where id % 10 = 0")
        seen = {}
        for client, cfg in configs.items():
            run_router(cfg)
            records = read_records(kafka_bootstrap, f"{name}_{client.replace('-', '_')}")
            for r in records:
                r["value"]["source"].pop("route")
            seen[client] = sorted((r["partition"], r["offset"], r["raw"][0],
                                   json.dumps(r["value"], sort_keys=True)) for r in records)
        assert len(seen["kafka-python"]) == 60 + 10 + 6
        assert seen["kafka-python"] == seen["librdkafka"]
    finally:
        for client in configs:
            pg.drop_slot(f"{name}_{client.replace('-', '_')}")
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}")
        pg.close()


@pytest.mark.parametrize("client", ["librdkafka"])
def test_killed_router_confirms_nothing_kafka_lacks(client, pg_dsn, kafka_bootstrap, tmp_path,
                                                    topics):
    """SIGKILL mid-load with the librdkafka client (the lead's fault tests cover both clients
    on a stack of their own; this one runs on the shared stack, killing only the router):
    whatever PostgreSQL has as confirmed is in Kafka, and after a rerun every row is."""
    import random
    import time as _time

    from tests.e2e import guarantee, test_faults as faults
    from tests.helpers import kill9, start_router

    rows = 6000
    pg = Pg(pg_dsn)
    name = unique("sinkkill")
    topics.append(name)
    pg.run(f"create table {name} (id bigint primary key, batch int, payload text)")
    pg.run(f"create publication {name} for table {name}")
    pg.run("select pg_create_logical_replication_slot(%s, 'test_decoding')", f"{name}_oracle")
    cfg = write_config(tmp_path / "router.toml", dsn=pg_dsn, slot=name, publications=[name],
                       bootstrap=kafka_bootstrap, kafka_extra=f'client = "{client}"',
                       routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                              f'topic = "{name}"\ntopic_settings = {{ partitions = 3 }}\n')
    try:
        run_router(cfg)  # the slot exists before the load
        load = faults.Load(pg_dsn, name, rows)
        load.start()
        rng = random.Random(8)
        samples = []
        for i in range(2):
            proc = start_router(cfg, tmp_path / f"router-{i}.log")
            _time.sleep(rng.uniform(2.5, 4.0))
            assert proc.poll() is None, (tmp_path / f"router-{i}.log").read_text()[-3000:]
            kill9(proc)
            deadline = _time.monotonic() + DEADLINE
            while pg.one("select active from pg_replication_slots where slot_name = %s", name):
                assert _time.monotonic() < deadline, "slot stayed active after the kill"
                _time.sleep(0.1)
            samples.append((faults.confirmed_lsn(pg, name),
                            faults.kafka_ids(kafka_bootstrap, name)[0]))
        assert any(in_kafka for _, in_kafka in samples), "killed before it delivered anything"
        load.join(timeout=120)
        assert not load.is_alive() and load.error is None, load.error
        run_router(cfg, timeout=120)
        ids, records = faults.kafka_ids(kafka_bootstrap, name)
        assert ids == {r[0] for r in pg.run(f"select id from {name}")}
        assert len(ids) == rows
        faults.assert_identical_duplicates(records)
        txns = guarantee.oracle_transactions(pg, f"{name}_oracle", name)
        for confirmed, in_kafka in samples:
            unsafe = [lsn for lsn, t_ids in txns if lsn <= confirmed and not t_ids <= in_kafka]
            assert not unsafe, f"{len(unsafe)} transactions confirmed but not in Kafka"
    finally:
        pg.drop_slot(name)
        pg.drop_slot(f"{name}_oracle")
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}")
        pg.close()
