"""Materializer config: msgspec validation (``pgrouter materialize``) and the stdlib twin in
``job.py`` (``spark-submit``) accept and reject the same files, naming the offending key."""

from __future__ import annotations

import pathlib
import tomllib

import pytest

from actors.materialize.config import parse
from actors.materialize.settings import MaterializeError, config_from_dict
from router.errors import ConfigError

BASE = """
[kafka]
bootstrap_servers = "k:9092"
topics = ["a", "b"]
[delta]
warehouse = "/wh"
checkpoint = "/ck"
"""


def both(text: str):
    """Parse with both validators; return (config, error path) from each."""
    out = []
    for fn, err in ((lambda t: parse(t), ConfigError),
                    (lambda t: config_from_dict(tomllib.loads(t)), MaterializeError)):
        try:
            out.append((fn(text), None))
        except err as exc:
            out.append((None, exc.path))
    return out


def test_minimal_defaults():
    for cfg, err in both(BASE):
        assert err is None
        assert cfg.mode == "state" and cfg.schema_topic == "pgrouter.schemas"
        assert cfg.starting_offsets == "earliest" and cfg.master == "local[*]"
        assert cfg.topics == ["a", "b"] and cfg.topic_pattern is None


def test_full_example_file():
    import pathlib
    text = (pathlib.Path(__file__).resolve().parents[3] / "configs/materialize.toml").read_text()
    (a, ea), (b, eb) = both(text)
    assert ea is None and eb is None and a == b
    assert a.max_offsets_per_trigger == 200000


@pytest.mark.parametrize("patch,path", [
    (BASE.replace('topics = ["a", "b"]', 'topics = ["a"]\ntopicz = 1'), "kafka.topicz"),
    (BASE + "[sparks]\n", "sparks"),
    (BASE + 'mode = "upsert"\n', "delta.mode"),
    (BASE.replace('warehouse = "/wh"', ""), "delta.warehouse"),
    (BASE.replace('topics = ["a", "b"]', ""), "kafka.topics"),
    (BASE.replace('topics = ["a", "b"]', 'topics = ["a"]\ntopic_pattern = "x.*"'), "kafka.topics"),
    (BASE + "[spark]\nconf = { a = 1 }\nextra = 2\n", "spark.extra"),
    (BASE + "max_offsets_per_trigger = 0\n", "max_offsets_per_trigger"),
    (BASE + 'tombstone_retention = "a week"\n', "delta.tombstone_retention"),
    (BASE + 'maintenance_interval = "-1 hours"\n', "delta.maintenance_interval"),
    (BASE + 'vacuum_retention = "7"\n', "delta.vacuum_retention"),
    (BASE + 'optimize = "yes"\n', "delta.optimize"),
    (BASE + "[spark]\nclass_archive = true\n", "spark.class_archive"),
])
def test_rejects_with_key_path(patch, path):
    for cfg, err in both(patch):
        assert cfg is None and err == path


def test_maintenance_keys():
    text = BASE + 'tombstone_retention = "7 days"\noptimize = true\nvacuum_retention = "168 hours"\n'
    for cfg, err in both(text):
        assert err is None
        assert (cfg.tombstone_retention, cfg.optimize, cfg.vacuum_retention,
                cfg.maintenance_interval) == ("7 days", True, "168 hours", "1 hour")
    for cfg, _ in both(BASE):
        assert cfg.tombstone_retention is None and not cfg.optimize


def test_max_offsets_top_level_or_kafka_not_both():
    top = "max_offsets_per_trigger = 10\n" + BASE
    for cfg, err in both(top):
        assert cfg.max_offsets_per_trigger == 10
    twice = top.replace('topics = ["a", "b"]', 'topics = ["a"]\nmax_offsets_per_trigger = 5')
    for cfg, err in both(twice):
        assert cfg is None and err.endswith("max_offsets_per_trigger")


def test_spark_conf_values_become_strings():
    for cfg, _ in both(BASE + "[spark]\nconf = { 'spark.x' = true, 'spark.n' = 4 }\n"):
        assert cfg.spark_conf == {"spark.x": "true", "spark.n": "4"}


def test_cli_reports_config_error_on_one_line(tmp_path, capsys):
    from actors.cli import main

    bad = tmp_path / "m.toml"
    bad.write_text(BASE + "[delta.nope]\n")
    assert main(["materialize", "-c", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "delta.nope" in err


class _Given:
    def __init__(self, **conf):
        self.conf = {k.replace("_", "."): v for k, v in conf.items()}

    def contains(self, key):
        return key in self.conf


def test_session_defaults_yield_to_spark_submit_and_config():
    from actors.materialize.job import JVM_OPTIONS, session_conf

    cfg = config_from_dict(tomllib.loads(BASE))
    conf = session_conf(cfg, _Given())
    assert conf["spark.sql.codegen.cache.maxEntries"] == "1000"
    assert conf["spark.driver.defaultJavaOptions"] == JVM_OPTIONS
    assert conf["spark.executor.defaultJavaOptions"] == JVM_OPTIONS
    # a cluster's own JVM options (spark-submit --conf, spark-defaults.conf) are kept
    conf = session_conf(cfg, _Given(spark_executor_defaultJavaOptions="-XX:+UseZGC"))
    assert "spark.executor.defaultJavaOptions" not in conf
    assert conf["spark.driver.defaultJavaOptions"] == JVM_OPTIONS
    # [spark] conf wins over every default
    spark = '[spark]\nconf = { "spark.sql.codegen.cache.maxEntries" = 50 }\n'
    cfg = config_from_dict(tomllib.loads(BASE + spark))
    assert session_conf(cfg, _Given())["spark.sql.codegen.cache.maxEntries"] == "50"


def test_class_archive_key():
    for cfg, err in both(BASE + '[spark]\nclass_archive = "/var/cache/pgrouter"\n'):
        assert err is None and cfg.class_archive == "/var/cache/pgrouter"
    for cfg, err in both(BASE):
        assert cfg.class_archive is None


def test_class_archive_plan(tmp_path, monkeypatch):
    """Named by a fingerprint (a changed jar or JVM option gets another archive); written to a
    temporary name of this process; a dead run's temporary file is removed, a live one's kept;
    an existing archive is mapped."""
    import os
    import subprocess

    from actors.materialize import class_archive as ca

    jar = tmp_path / "a.jar"
    jar.write_bytes(b"x")
    first = ca.plan(str(tmp_path / "cds"), [str(jar)], "-Xmx1g")
    assert first.writing == f"{first.path}.{os.getpid()}.tmp"
    assert f"-XX:ArchiveClassesAtExit={first.writing}" in first.options
    assert ca.plan(str(tmp_path / "cds"), [str(jar)], "-Xmx2g").path != first.path
    jar.write_bytes(b"xy")
    assert ca.plan(str(tmp_path / "cds"), [str(jar)], "-Xmx1g").path != first.path
    jar.write_bytes(b"x")
    os.utime(jar, ns=(0, 0))
    base = ca.plan(str(tmp_path / "cds"), [str(jar)], "-Xmx1g").path
    dead = subprocess.Popen(["true"])
    dead.wait()
    for pid in (dead.pid, os.getppid()):
        pathlib.Path(f"{base}.{pid}.tmp").write_bytes(b"partial")
    again = ca.plan(str(tmp_path / "cds"), [str(jar)], "-Xmx1g")
    assert again.path == base
    assert sorted(p.name for p in (tmp_path / "cds").iterdir()) == [
        pathlib.Path(f"{base}.{os.getppid()}.tmp").name]
    pathlib.Path(base).write_bytes(b"archive")
    used = ca.plan(str(tmp_path / "cds"), [str(jar)], "-Xmx1g")
    assert used.writing is None and used.options == f"-XX:SharedArchiveFile={base}"


def test_reason_is_one_line_saying_why():
    from actors.materialize.settings import reason

    class Captured(Exception):  # how pyspark carries a failed Python worker's traceback
        def __init__(self, desc):
            super().__init__("An exception was thrown from the Python worker.")
            self._desc = desc

    worker = Captured("An exception was thrown from the Python worker:\nTraceback (most recent "
                      "call last):\n  File \"columns.py\", line 140, in parse\n    raise\n"
                      "ValueError: column 'a': multi-dimensional arrays are not supported\n")
    assert reason(worker) == "ValueError: column 'a': multi-dimensional arrays are not supported"
    java = RuntimeError("[DELTA_CONCURRENT_APPEND] Files were added\n\tat org.apache.Foo\n")
    assert reason(java) == "[DELTA_CONCURRENT_APPEND] Files were added"
    assert reason(RuntimeError("")) == "RuntimeError"


def test_registry_table_of_avro_topics():
    """``[kafka.registry]``: the router's table (its writer-only keys accepted), the same
    settings from both validators; the password is not in the config's repr."""
    text = BASE + ('[kafka.registry]\nurl = "https://reg:8081/apis/ccompat/v7"\n'
                   'username = "u"\npassword = "secret"\nssl_ca_location = "/ca.pem"\n'
                   'timeout = 5\ncompatibility = "BACKWARD"\n')
    (a, ea), (b, eb) = both(text)
    assert ea is None and eb is None and a == b
    assert (a.registry.url, a.registry.username, a.registry.password, a.registry.timeout,
            a.registry.ssl_ca_location) == ("https://reg:8081/apis/ccompat/v7", "u", "secret", 5,
                                             "/ca.pem")
    assert "secret" not in repr(a)
    for cfg, _ in both(BASE):
        assert cfg.registry is None


@pytest.mark.parametrize("table,path", [
    ('url = "http://r"\nurlz = 1\n', "kafka.registry.urlz"),
    ('username = "u"\n', "kafka.registry.url"),
    ('url = "http://r"\ntimeout = "fast"\n', "kafka.registry.timeout"),
])
def test_registry_table_rejects_with_key_path(table, path):
    for cfg, err in both(BASE + "[kafka.registry]\n" + table):
        assert cfg is None and err == path


ICEBERG = """
[kafka]
bootstrap_servers = "k:9092"
topics = ["a"]
[delta]
checkpoint = "/ck"
[output]
format = "iceberg"
[iceberg]
catalog = "jdbc"
uri = "jdbc:postgresql://db:5432/iceberg"
user = "pgr"
warehouse = "s3://bucket/wh"
options = { "io-impl" = "org.apache.iceberg.aws.s3.S3FileIO" }
"""


def test_iceberg_output_keys():
    for cfg, err in both(ICEBERG):
        assert err is None
        assert (cfg.output_format, cfg.iceberg_catalog, cfg.iceberg_name) == (
            "iceberg", "jdbc", "pgrouter")
        assert cfg.iceberg_uri.endswith("/iceberg") and cfg.warehouse == "s3://bucket/wh"
        assert cfg.iceberg_options == {"io-impl": "org.apache.iceberg.aws.s3.S3FileIO"}
        assert (cfg.compact_interval, cfg.snapshot_retention) == ("1 hour", "1 day")
    for cfg, err in both(BASE):
        assert cfg.output_format == "delta"


@pytest.mark.parametrize("edit, path", [
    (('uri = "jdbc:postgresql://db:5432/iceberg"\n', ""), "iceberg.uri"),  # jdbc needs it
    (('warehouse = "s3://bucket/wh"\n', ""), "iceberg.warehouse"),
    (('format = "iceberg"', 'format = "hudi"'), "output.format"),
    (('catalog = "jdbc"', 'catalog = "glue"'), "iceberg.catalog"),
    (('user = "pgr"', 'compact_interval = "soon"'), "iceberg.compact_interval"),
    (('user = "pgr"', 'usr = "pgr"'), "iceberg.usr"),
])
def test_iceberg_keys_rejected_with_their_path(edit, path):
    for cfg, err in both(ICEBERG.replace(*edit)):
        assert cfg is None and err == path


def test_delta_needs_its_warehouse_and_compact_refuses_delta():
    from actors.materialize import job

    text = BASE.replace('warehouse = "/wh"\n', "")
    for cfg, err in both(text):
        assert cfg is None and err == "delta.warehouse"
    with pytest.raises(MaterializeError, match=r"--compact compacts Iceberg tables"):
        job.compact(parse(BASE))
    with pytest.raises(MaterializeError, match=r"--tables lists Iceberg tables"):
        job.table_stats(parse(BASE))
