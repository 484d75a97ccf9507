"""One table read by several sessions at once in the initial snapshot (``ctid`` block
ranges, ``router.snapshot.core.block_ranges``), on the real stack.

The table is big enough in blocks to be split (wide rows and ``fillfactor = 10`` make few
rows fill many blocks): every session imports the slot's exported snapshot, so the ranges together are
exactly the table at the consistent point; the folded topic equals the table, also when
the router is killed with SIGKILL in the middle of the copy and finishes it on restart.
"""

from __future__ import annotations

import time

import pytest

from router.snapshot.core import RANGE_SHIFT, TABLE_SHIFT
from router.snapshot.ranges import MIN_RANGE_BLOCKS
from tests.e2e.guarantee import delete_topics
from tests.e2e.test_snapshot import _initial_done
from tests.helpers import (Pg, database_dsn, fold_rows, kill9, read_topic, start_router, table_rows, unique,
                           write_config)

pytestmark = pytest.mark.services

ROWS = 10_000
DEADLINE = 120


@pytest.fixture(scope="module")
def big(pg_dsn):
    """A table of more than two ``MIN_RANGE_BLOCKS`` blocks and its publication."""
    pg = Pg(pg_dsn)
    name = unique("snapr")
    pg.run(f"create table {name} (id int primary key, n int, v text) with (fillfactor = 10)")
    # ~340 bytes a row (stored as is: below TOAST's threshold), two rows a block
    pg.run(f"insert into {name} select g, 0, 'v' || g || repeat('x', 330) "
           f"from generate_series(1, {ROWS}) g")
    pg.run(f"vacuum analyze {name}")
    blocks = pg.one(f"select pg_relation_size('{name}') / current_setting('block_size')::int")
    assert blocks >= 2 * MIN_RANGE_BLOCKS, blocks
    pg.run(f"create publication {name} for table {name}")
    yield pg, name
    pg.run(f"drop publication if exists {name}")
    pg.run(f"drop table if exists {name}")
    pg.close()


#: bytes/s a connection of the router reads from PostgreSQL in the kill tests: the table
#: (~3.5 MB of COPY text, 4 ranges read by 2 sessions) takes about 3 s, so its records reach
#: Kafka chunk by chunk, ranges are recorded done one by one, and a kill after the first
#: range done lands well before the last is read (at 1.5 MB/s, on a CI machine busy with
#: other tests, the whole table was once read before the kill)
SLOW_LINK = 600_000


def _config(tmp_path, dsn, bootstrap, name, slot):
    return write_config(tmp_path / "router.toml", dsn=dsn, slot=slot, publications=[name],
                        bootstrap=bootstrap,
                        routes=f'[[routes]]\nname = "{slot}"\ntables = ["public.{name}"]\n'
                               f'topic = "{slot}.t"\n',
                        extra="[snapshot]\nparallel = 2\nchunk_rows = 5000\n")


class _SlowSource:
    """The source's DSN through a forwarder that caps each connection at ``SLOW_LINK``."""

    def __init__(self, dsn: str):
        from psycopg2.extensions import parse_dsn

        from tests.e2e.tcp_proxy import PausableProxy

        d = parse_dsn(dsn)
        port = int(d.get("port", 5432))
        self.proxy = PausableProxy((d.get("host", "127.0.0.1"), port), rate=SLOW_LINK)
        self.dsn = database_dsn(dsn, d.get("dbname", "postgres")).replace(
            f":{port}/", f":{self.proxy.port}/")

    def close(self) -> None:
        self.proxy.close()


def _folded(bootstrap, topic):
    records = read_topic(bootstrap, topic, timeout=120)
    folded = fold_rows(records, ["id"])
    return records, {(str(k[0] if isinstance(k, tuple) else k), str(r["n"]), r["v"])
                     for k, r in folded.items()}


def _range_of(record) -> int:
    return (record["value"]["source"]["seq"] >> RANGE_SHIFT) & ((1 << (TABLE_SHIFT - RANGE_SHIFT)) - 1)


def _wait(what, check, proc, log, deadline):
    while True:
        got = check()
        if got:
            return got
        assert proc.poll() is None, f"router exited:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" \
                                            f"{log.read_text()[-3000:]}"
        time.sleep(0.05)


def _caught_up(pg, slot, proc, log, deadline):
    lsn = pg.one("select pg_current_wal_lsn()::text")
    _wait("the router to catch up", lambda: pg.one(
        "select confirmed_flush_lsn >= %s::pg_lsn from pg_replication_slots where "
        "slot_name = %s", lsn, slot), proc, log, deadline)


def test_a_table_read_by_two_sessions_is_the_table(big, pg_dsn, kafka_bootstrap, tmp_path):
    """Two sessions read the table's block ranges on the one exported snapshot: together
    they hold every row once."""
    pg, name = big
    slot = unique("snapr")
    cfg = _config(tmp_path, pg_dsn, kafka_bootstrap, name, slot)
    log = tmp_path / "router.log"
    proc = start_router(cfg, log)
    deadline = time.monotonic() + DEADLINE
    try:
        _wait("the initial snapshot", lambda: "initial snapshot done" in log.read_text(), proc,
              log, deadline)
        pg.run(f"update {name} set n = 1 where id % 1000 = 0")  # streamed after the copy
        _caught_up(pg, slot, proc, log, deadline)
    finally:
        kill9(proc)
        pg.drop_slot(slot)
    try:
        records, got = _folded(kafka_bootstrap, f"{slot}.t")
    finally:
        delete_topics(kafka_bootstrap, [f"{slot}.t"])
    assert got == table_rows(pg.conn, name, ["id", "n", "v"])
    snap = [r for r in records if r["value"]["op"] == "r"]
    assert len(snap) == ROWS  # every row once
    # read as several ranges, each with its own positions
    assert len({_range_of(r) for r in snap}) >= 2
    assert "range done" in log.read_text()


def test_a_table_read_by_two_sessions_after_a_kill_is_the_table(big, pg_dsn, kafka_bootstrap,
                                                                 tmp_path):
    """SIGKILL in the middle of the two sessions' copy, after a range was recorded done: the
    next start finishes the snapshot by backfill without reading that range again, and the
    folded topic equals the table, changes made meanwhile included."""
    from kafka import KafkaConsumer, TopicPartition

    pg, name = big
    slot = unique("snapr")
    topic = f"{slot}.t"
    source = _SlowSource(pg_dsn)
    cfg = _config(tmp_path, source.dsn, kafka_bootstrap, name, slot)
    log = tmp_path / "router.log"
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap)
    part = TopicPartition(topic, 0)

    def written() -> int:
        if not consumer.partitions_for_topic(topic):
            return 0
        return consumer.end_offsets([part])[part]

    proc = start_router(cfg, log)
    deadline = time.monotonic() + DEADLINE
    try:
        # a range is in Kafka (and recorded done), not the whole table
        _wait("a range done", lambda: "initial snapshot: range done" in log.read_text(), proc,
              log, deadline)
        kill9(proc)
        assert written() < ROWS and "initial snapshot done" not in log.read_text(), \
            "the kill came too late"
        pg.run(f"update {name} set n = 2 where id % 500 = 0")
        pg.run(f"delete from {name} where id % 777 = 0")
        pg.run(f"insert into {name} values ({ROWS + 1}, 3, 'new')")
        proc = start_router(cfg, log)
        _wait("the snapshot to be finished by backfill", lambda: "finishing it by backfill"
              in log.read_text() and _initial_done(kafka_bootstrap, slot), proc, log, deadline)
        _caught_up(pg, slot, proc, log, deadline)
    finally:
        consumer.close()
        kill9(proc)
        source.close()
        pg.drop_slot(slot)
    try:
        records, got = _folded(kafka_bootstrap, topic)
    finally:
        delete_topics(kafka_bootstrap, [topic])
    assert got == table_rows(pg.conn, name, ["id", "n", "v"])
    # the range recorded done is not read again: the backfill read fewer rows than the table
    first = min(r["value"]["source"]["commit_lsn"] for r in records)
    again = [r for r in records if r["value"]["op"] == "r"
             and r["value"]["source"]["commit_lsn"] > first]
    assert 0 < len(again) < len(got) * 0.9, (len(again), len(got))
    assert "leaves out the block ranges the initial snapshot did" in log.read_text()


def test_a_slot_created_again_does_not_trust_the_earlier_snapshots_records(big, pg_dsn,
                                                                        kafka_bootstrap,
                                                                        tmp_path):
    """A slot dropped and created again under its name takes a new initial snapshot; when
    that one is interrupted before its table is done, finishing it by backfill reads the
    table again: the earlier snapshot's "table done" record (same slot, route and table)
    does not count for it. Rows changed while no slot existed are in the topic."""
    pg, name = big
    slot = unique("snapr")
    topic = f"{slot}.t"
    log = tmp_path / "router.log"
    deadline = time.monotonic() + DEADLINE
    proc = start_router(_config(tmp_path, pg_dsn, kafka_bootstrap, name, slot), log)
    source = _SlowSource(pg_dsn)
    try:
        _wait("the first initial snapshot", lambda: "initial snapshot done" in log.read_text(),
              proc, log, deadline)
        kill9(proc)
        pg.drop_slot(slot)
        pg.run(f"update {name} set n = 7 where id % 300 = 0")  # no slot: not streamed
        # the second snapshot, killed before its table is in Kafka
        slow = _config(tmp_path, source.dsn, kafka_bootstrap, name, slot)
        log.write_text("")
        proc = start_router(slow, log)
        _wait("the second snapshot's slot", lambda: "exported snapshot" in log.read_text(),
              proc, log, deadline)
        kill9(proc)
        assert "range done" not in log.read_text() and "snapshot done" not in log.read_text()
        log.write_text("")
        proc = start_router(_config(tmp_path, pg_dsn, kafka_bootstrap, name, slot), log)
        _wait("the snapshot to be finished by backfill", lambda: "finishing it by backfill"
              in log.read_text() and _last_initial(kafka_bootstrap, slot) == "done", proc,
              log, deadline)
        _caught_up(pg, slot, proc, log, deadline)
    finally:
        kill9(proc)
        source.close()
        pg.drop_slot(slot)
    try:
        _records, got = _folded(kafka_bootstrap, topic)
    finally:
        delete_topics(kafka_bootstrap, [topic])
    assert got == table_rows(pg.conn, name, ["id", "n", "v"])


def _last_initial(bootstrap: str, slot: str) -> str | None:
    """The state of the slot's latest ``initial`` progress record."""
    states = [r["value"]["state"] for r in read_topic(bootstrap, "pgrouter.snapshots")
              if r["value"]["kind"] == "initial" and r["value"]["slot"] == slot]
    return states[-1] if states else None
