"""The materializer's parse of a micro-batch's records (``Materializer._parse``) in a real Spark
session: each record's JSON is parsed once, and only change records, records that do not parse
and Avro records reach the rest of the batch."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.services, pytest.mark.spark]


def _records(spark, topic: str):
    change = {"op": "c", "before": None, "after": {"id": 1, "note": "a"},
              "source": {"route": "r", "schema": "public", "table": "t", "schema_id": "s1",
                         "commit_lsn": 10, "seq": 0}}
    other = {"op": "x", "source": {"route": "r", "schema": "public", "table": "t"}}
    values = [json.dumps(change).encode(), json.dumps(other).encode(), b"not json"]
    rows = [(b"k", v, topic, 0, i) for i, v in enumerate(values)]
    return spark.createDataFrame(rows, "key binary, value binary, topic string, partition int, "
                                       "offset bigint")


def test_each_record_is_parsed_once_and_only_change_records_are_kept(spark, tmp_path):
    """A filter on the parsed ``op`` below the cache was pushed by Spark under the parse, so
    the batch's plan parsed every record twice (two ``from_json``)."""
    from actors.materialize import job
    from actors.materialize.merge import Materializer

    cfg = job.JobConfig(bootstrap_servers="127.0.0.1:1", topics=["t"], schema_topic="schemas",
                        warehouse=str(tmp_path / "wh"), checkpoint=str(tmp_path / "ck"))
    m = Materializer(spark, cfg)
    env = m._parse(_records(spark, "t"), (("id", "bigint"), ("note", "string")))
    try:
        plan = env._jdf.queryExecution().executedPlan().toString()
        assert plan.count("from_json(") == 1, plan
        kept = sorted((str(r.op), r._pgr_corrupt is not None) for r in m._kept(env).collect())
        assert kept == [("None", True), ("c", False)]
    finally:
        env.unpersist()
