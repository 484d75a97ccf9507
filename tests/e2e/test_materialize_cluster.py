"""The materializer on a real Spark standalone cluster (master + 2 workers started from pyspark's
own distribution), with PostgreSQL as the oracle: PostgreSQL -> ``pgrouter run`` -> Kafka ->
``spark-submit --master spark://…`` (jars and the ``--py-files`` bundle shipped to the
executors) -> Delta, then a second incremental run through ``pgrouter materialize`` against the
same cluster. The cluster's processes are stopped at the end.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.services, pytest.mark.spark]

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    from devstack import SparkCluster

    c = SparkCluster(tmp_path_factory.mktemp("spark"), workers=2, cores=1, memory="1g")
    try:
        c.start()
        # the test's local Spark session (its reader of the Delta tables) starts while the
        # cluster's master and workers do, instead of after them
        request.getfixturevalue("spark")
    except BaseException:
        c.down()
        raise
    try:
        url = c.wait(timeout=180)
    except Exception as exc:
        c.down()
        pytest.fail(f"Spark standalone cluster could not be started: {exc}", pytrace=False)
    yield c, url
    c.down()
    assert not c.running()


def _compare(spark, pg, path: str, table: str) -> int:
    got = {r["id"]: r.asDict() for r in spark.read.format("delta").load(path)
           .filter("NOT _pgr_deleted").collect()}
    want = {r[0]: r for r in pg.run(f"select id, name, amount, tags, note from {table}")}
    assert set(got) == set(want)
    for id_, (_, name, amount, tags, note) in want.items():
        g = got[id_]
        assert (g["name"], g["amount"], g["tags"], g["note"]) == (name, amount, tags, note), id_
    return len(want)


def test_cluster_spark_submit_and_pgrouter_materialize(cluster, spark, pg_dsn, kafka_bootstrap,
                                                       tmp_path):
    from actors.materialize.jars import spark_jars
    from actors.materialize.bundle import write_bundle
    from tests.helpers import Pg, run_router, unique, write_config

    c, url = cluster
    pg = Pg(pg_dsn)
    name = unique("mzc")
    t = f"{name}_t"
    pg.run(f"create table {t} (id int primary key, name text, amount numeric(10,2), "
           f"tags int[], note text)")
    pg.run(f"alter table {t} alter column note set storage external")
    pg.run(f"create publication {name} for table {t}")
    router_cfg = write_config(tmp_path / "router.toml", dsn=pg_dsn, slot=name,
                              publications=[name], bootstrap=kafka_bootstrap,
                              kafka_extra=f'schema_topic = "{name}.schemas"',
                              routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{t}"]\n'
                                     f'topic = "{{route}}.{{schema}}.{{table}}"\n')
    conf = tmp_path / "materialize.toml"
    conf.write_text(f"""
[kafka]
bootstrap_servers = "{kafka_bootstrap}"
topic_pattern = "{name}\\\\.public\\\\..*"
schema_topic = "{name}.schemas"
[spark]
master = "{url}"
conf = {{ "spark.executor.memory" = "512m", "spark.executor.cores" = "1", "spark.sql.shuffle.partitions" = "2" }}
[delta]
warehouse = "{tmp_path / 'wh'}"
checkpoint = "{tmp_path / 'ck'}"
""")
    path = str(tmp_path / "wh" / name / "public" / t)
    big = "x" * 3000
    bundle = write_bundle(tmp_path / "pgrouter-materialize.zip")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    # the job runs from a folder without the source tree: its modules come from the bundle
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    try:
        pg.run(f"select pg_create_logical_replication_slot('{name}', 'pgoutput')")
        pg.run(f"insert into {t} select i, 'n' || i, i * 1.25, array[i, null], '{big}' || i "
               f"from generate_series(1, 60) i")
        pg.run(f"update {t} set name = 'toast kept' where id <= 10")
        pg.run(f"delete from {t} where id between 11 and 15")
        pg.run(f"update {t} set id = id + 1000 where id between 16 and 18")
        run_router(router_cfg)
        submit = [str(pathlib.Path(sys.executable).parent / "spark-submit"), "--master", url,
                  "--jars", ",".join(spark_jars(ROOT / ".devstack")),
                  "--py-files", str(bundle), "--conf", "spark.executor.memory=512m",
                  str(ROOT / "actors" / "materialize" / "job.py"),
                  "--config", str(conf), "--available-now"]
        done = subprocess.run(submit, cwd=outside, env={**env, "PYTHONPATH": ""},
                              capture_output=True, text=True, timeout=400)
        assert done.returncode == 0, done.stderr[-3000:]
        assert c.applications() == ["pgrouter-materialize"]  # it ran on the cluster
        assert _compare(spark, pg, path, t) == 55

        pg.run(f"update {t} set name = 'second run', tags = array[7] where id > 1000")
        pg.run(f"delete from {t} where id <= 5")
        pg.run(f"insert into {t} values (500, 'late', 1.5, '{{1,2}}', 'short')")
        run_router(router_cfg)
        done = subprocess.run([sys.executable, "-m", "actors.cli", "materialize", "-c", str(conf),
                               "--available-now", "--devstack-dir", str(ROOT / ".devstack")],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
        assert done.returncode == 0, done.stderr[-3000:]
        assert _compare(spark, pg, path, t) == 51
        assert c.applications() == ["pgrouter-materialize"] * 2
    finally:
        pg.drop_slot(name)
        pg.run(f"drop publication if exists {name}")
