"""A large transaction the server sends at its commit (``[source] streaming = false``) is
produced while it arrives: its first records are in Kafka before the router has received
its Commit (a proxy holds the stream there). It is confirmed only after the Commit, so a
``kill -9`` or a drain in the middle loses nothing: the next run sends it again (duplicates
at the same positions in at-least-once mode; exactly-once leaves a ``read_committed``
consumer nothing of the interrupted run and each change once)."""

from __future__ import annotations

import signal

import pytest

from tests.e2e.guarantee import topic_size, wait_for
from tests.e2e.hold_proxy import CommitHoldingProxy
from tests.e2e.test_exactly_once import read_committed
from tests.helpers import (Pg, drop_source, fold_rows, kill9, read_topic, run_router,
                           start_router, unique, write_config)

pytestmark = pytest.mark.services
ROWS = 60_000
#: small, so the transaction is far larger than what the router may hold
MEMORY_LIMIT = 2 * 1024 * 1024


@pytest.fixture
def source(pg_dsn, kafka_bootstrap, tmp_path):
    pg = Pg(pg_dsn)
    name = unique("bigtx")
    pg.run(f"create table {name} (id bigint primary key, n int, payload text)")
    pg.run(f"create publication {name} for table {name}")
    port = int(pg.dsn.rsplit(":", 1)[1].split("/")[0])
    proxy = CommitHoldingProxy(port)

    def config(*, through_proxy: bool, exactly_once: bool = False):
        dsn = pg.dsn.replace(f":{port}/", f":{proxy.port}/") if through_proxy else pg.dsn
        eo = f'exactly_once = true\ncommitted_lsn_topic = "{name}.progress"\n'
        return write_config(
            tmp_path / f"router-{through_proxy}.toml", dsn=dsn, slot=name,
            publications=[name], bootstrap=kafka_bootstrap,
            source_extra=(f"streaming = false\nmemory_limit = {MEMORY_LIMIT}\n"
                          f'spill_dir = "{tmp_path}"'),
            kafka_extra='client = "librdkafka"\n' + (eo if exactly_once else ""),
            routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                   f'topic = "{name}"\ntopic_settings = {{ partitions = 3 }}\n')

    yield pg, name, config, proxy
    proxy.release.set()
    proxy.close()
    drop_source(pg, name, kafka_bootstrap, (name, f"{name}.progress"))


def held_at_commit(pg: Pg, name: str, proxy: CommitHoldingProxy, proc, log) -> str:
    """The big transaction written while the router streams through ``proxy``, which holds
    it at its Commit; returns the transaction's commit LSN."""
    wait_for(lambda: pg.run("select 1 from pg_replication_slots where slot_name = %s and "
                            "active", name) or proc.poll() is not None,
             timeout=120, what="the router to stream")
    assert proc.poll() is None, log.read_text()[-3000:]
    proxy.armed.set()
    pg.run(f"insert into {name} select g, g % 7, repeat('x', 50) "
           f"from generate_series(1, {ROWS}) g")
    end = pg.one("select pg_current_wal_lsn()::text")
    wait_for(lambda: proxy.holding.is_set() or proc.poll() is not None, timeout=180,
             what="the stream held at the transaction's Commit")
    assert proc.poll() is None, log.read_text()[-3000:]
    return end


def unconfirmed(pg: Pg, name: str, end: str) -> bool:
    return pg.one("select confirmed_flush_lsn < %s::pg_lsn from pg_replication_slots "
                  "where slot_name = %s", end, name)


def folded_equals_table(pg: Pg, name: str, bootstrap: str) -> list[dict]:
    records = read_topic(bootstrap, name, timeout=120)
    table = {(i,): {"id": i, "n": n, "payload": p}
             for i, n, p in pg.run(f"select id, n, payload from {name}")}
    assert fold_rows(records, ["id"]) == table
    return records


def test_records_reach_kafka_before_the_commit_and_a_kill_loses_none(source, kafka_bootstrap,
                                                                      tmp_path):
    pg, name, config, proxy = source
    log = tmp_path / "held.log"
    proc = start_router(config(through_proxy=True), log)
    try:
        end = held_at_commit(pg, name, proxy, proc, log)
        # a plain consumer reads the transaction's first records while its Commit is held
        first = wait_for(lambda: read_topic(kafka_bootstrap, name, timeout=60,
                                            missing_ok=True, settle=0),
                         timeout=180, what="records before the Commit")
        assert proxy.holding.is_set()
        assert {r["value"]["op"] for r in first} == {"c"}
        assert unconfirmed(pg, name, end), "confirmed a transaction whose Commit is held"
        kill9(proc)
    finally:
        kill9(proc)
    proxy.release.set()
    assert unconfirmed(pg, name, end), "the kill left the transaction confirmed"
    run_router(config(through_proxy=False), timeout=300)
    records = folded_equals_table(pg, name, kafka_bootstrap)
    # sent again whole: duplicates are the same records at the same positions
    by_position: dict = {}
    for r in records:
        pos = (r["value"]["source"]["commit_lsn"], r["value"]["source"]["seq"])
        assert by_position.setdefault(pos, r["value"]) == r["value"]
    assert len(by_position) == ROWS and len(records) > ROWS


def test_a_drain_while_the_commit_is_held_exits_and_confirms_none_of_it(source,
                                                                         kafka_bootstrap,
                                                                         tmp_path):
    pg, name, config, proxy = source
    log = tmp_path / "drain.log"
    proc = start_router(config(through_proxy=True), log)
    try:
        end = held_at_commit(pg, name, proxy, proc, log)
        wait_for(lambda: topic_size(kafka_bootstrap, name), timeout=180,
                 what="records before the Commit")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        kill9(proc)
    text = log.read_text()
    assert "input ended inside a source transaction" in text and "Traceback" not in text
    assert unconfirmed(pg, name, end), "the drain confirmed a transaction it did not finish"
    proxy.release.set()
    run_router(config(through_proxy=False), timeout=300)
    folded_equals_table(pg, name, kafka_bootstrap)


def test_exactly_once_a_kill_before_the_commit_leaves_read_committed_nothing_of_it(
        source, kafka_bootstrap, tmp_path):
    pg, name, config, proxy = source
    log = tmp_path / "eo.log"
    proc = start_router(config(through_proxy=True, exactly_once=True), log)
    try:
        end = held_at_commit(pg, name, proxy, proc, log)
        # produced inside the open Kafka transaction: in the log, not committed
        wait_for(lambda: topic_size(kafka_bootstrap, name), timeout=180,
                 what="records before the Commit")
        assert read_committed(kafka_bootstrap, name) == []
        kill9(proc)
    finally:
        kill9(proc)
    proxy.release.set()
    assert unconfirmed(pg, name, end)
    run_router(config(through_proxy=False, exactly_once=True), timeout=300)
    values = [v for _, _, v in read_committed(kafka_bootstrap, name)]
    assert len(values) == ROWS, "each change once for read_committed"
