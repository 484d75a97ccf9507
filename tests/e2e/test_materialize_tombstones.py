"""The materializer reads a topic of a route with ``tombstones = true``: a tombstone (null
value) after a delete is skipped, the delete before it is the change; the job neither stops
on it nor writes a row for it, in state mode and in changelog mode."""

from __future__ import annotations

import uuid

import pytest

from router.stream.changes import Change, Changes
from router.pgoutput import Relation, RelationColumn
from router.routing.change_router import ChangeRouter, RouteSpec
from router.formats.schema import encode_schema
from router.stream.transactions import Transaction
from tests.e2e.guarantee import delete_topics
from tests.e2e.test_materialize import Feed, _config

pytestmark = pytest.mark.services

REL = Relation(7, "public", "tomb", "d", (RelationColumn(1, "id", 23, -1),
                                          RelationColumn(0, "v", 25, -1)))


def test_tombstones_are_skipped_by_the_materializer(spark, kafka_bootstrap, tmp_path):
    from actors.materialize import job

    feed = Feed(kafka_bootstrap, uuid.uuid4().hex[:8])
    router = ChangeRouter([RouteSpec(name="r", all_tables=True, tombstones=True)], db="postgres")
    changes = [Change("insert", 1, REL, new=("1", "a")), Change("insert", 2, REL, new=("2", "b")),
               Change("insert", 3, REL, new=("3", "c")),
               Change("delete", 4, REL, old=("2", None), old_is_key=True),
               Change("update", 5, REL, old=("3", None), old_is_key=True, new=("30", "c"))]
    lsn = 0x2000000
    t = Transaction(9, lsn, lsn, lsn + 8, 789_000_000_000_000, None, None, None,
                    Changes(changes, (), None, (), frozenset(), len(changes)), len(changes))
    try:
        [chunk] = router.route(t)
        for schema in chunk.schemas:
            k, v = encode_schema(schema)
            feed.producer.send(feed.schema_topic, key=k, value=v).get(timeout=30)
        for _, key, value, _ in chunk.records:
            feed.send((key, value))
        feed.flush()
        assert sum(v is None for _, v in feed.sent) == 2  # the delete's and the old key's
        state = _config(tmp_path / "s", kafka_bootstrap, feed, "state")
        job.Materializer(spark, state).run(available_now=True)
        rows = {r["id"]: (r["v"], r["_pgr_deleted"]) for r in spark.read.format("delta").load(
            f"{state.warehouse}/r/public/tomb").collect()}
        assert {i: v for i, (v, gone) in rows.items() if not gone} == {1: "a", 30: "c"}
        assert rows[2][1], "the delete before the tombstone removed the row"
        changelog = _config(tmp_path / "c", kafka_bootstrap, feed, "changelog")
        job.Materializer(spark, changelog).run(available_now=True)
        ops = [r["_pgr_op"] for r in spark.read.format("delta").load(
            f"{changelog.warehouse}/r/public/tomb").collect()]
        assert sorted(ops) == ["c", "c", "c", "d", "u"], ops
    finally:
        delete_topics(kafka_bootstrap, [feed.topic, feed.schema_topic])
