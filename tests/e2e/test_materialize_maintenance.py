"""Table maintenance of the materializer against real Kafka, Spark and Delta: a tombstone guards
its key against a late older record while it is kept, and is removed once its delete is older
than ``tombstone_retention``; OPTIMIZE and VACUUM run when configured."""

from __future__ import annotations

import time
import uuid

import pytest

from router.formats.envelope import TableEncoder, TxContext
from router.pgoutput import Relation, RelationColumn
from tests.e2e.test_materialize import Feed, _config

pytestmark = [pytest.mark.services, pytest.mark.spark]

PG_EPOCH = 946_684_800  # 2000-01-01 in Unix seconds: commit times are PostgreSQL's micros


def _tx(feed: Feed, at: float) -> TxContext:
    tx = feed.tx()
    return TxContext(xid=tx.xid, commit_lsn=tx.commit_lsn, end_lsn=tx.end_lsn,
                     commit_time=int((at - PG_EPOCH) * 1_000_000))


def test_tombstones_guard_within_retention_then_go(spark, kafka_bootstrap, tmp_path):
    from actors.materialize import job

    feed = Feed(kafka_bootstrap, uuid.uuid4().hex[:8])
    enc = TableEncoder(Relation(8, "public", "kept", "d", (RelationColumn(1, "id", 23, -1),
                                                           RelationColumn(0, "v", 25, -1))),
                       route="m", db="postgres")
    feed.schema(enc)
    path = f"{tmp_path}/wh/m/public/kept"

    def run(retention: str):
        feed.flush()
        cfg = _config(tmp_path, kafka_bootstrap, feed, "state", maintenance_interval="0 seconds",
                      tombstone_retention=retention, optimize=True, vacuum_retention="168 hours")
        job.Materializer(spark, cfg).run(available_now=True)
        return {r.id: (r.v, r._pgr_deleted) for r in spark.read.format("delta").load(path)
                .collect()}

    old = _tx(feed, time.time() - 3600)
    ins1 = feed.send(enc.encode("c", old, old.commit_lsn, 0, old=None, old_is_key=False,
                                new=("1", "one")))
    feed.send(enc.encode("c", old, old.commit_lsn + 1, 1, old=None, old_is_key=False,
                         new=("2", "two")))
    deleted_at = time.time()
    now = _tx(feed, deleted_at)
    feed.send(enc.encode("d", now, now.commit_lsn, 0, old=("1", None), old_is_key=True, new=None))
    assert run("1 hour") == {1: (None, True), 2: ("two", False)}  # a fresh tombstone is kept

    feed.send(ins1)  # late and older than the delete: the tombstone refuses it
    assert run("1 hour") == {1: (None, True), 2: ("two", False)}

    # the job restarted with a retention the delete is older than
    time.sleep(max(0.0, deleted_at + 2 - time.time()))
    later = _tx(feed, time.time())
    feed.send(enc.encode("u", later, later.commit_lsn, 0, old=None, old_is_key=True,
                         new=("2", "two again")))
    assert run("1 seconds") == {2: ("two again", False)}  # past the retention: it is gone
    ops = [r.operation for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()]
    assert "DELETE" in ops and "VACUUM END" in ops  # OPTIMIZE commits only when it compacts

