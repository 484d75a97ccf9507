"""Kafka Connect standalone with Debezium's JDBC sink connector, for the end-to-end check that
a sink pgrouter did not write consumes its Connect-format topics (README "Kafka Connect
records"). Jars come from Maven Central like the broker's (``maven``).

Rules:

* The worker is Kafka's own ``ConnectStandalone`` (``connect-runtime`` of the broker's
  version) with ``JsonConverter`` (``schemas.enable=true``) for keys and values, reading
  ``read_committed``.
* The connector is ``io.debezium:debezium-connector-jdbc`` in a plugin folder of its own.
  Maven Central here lacks the ``hibernate-agroal`` build it names, so the nearest one that
  is served is used; Jackson comes from the worker (two copies break its service loading),
  and only the PostgreSQL driver is kept.
* Debezium's POM names other repositories: Maven is pointed at Maven Central only.
* With ``registry`` (the Apicurio Registry's core API, ``…/apis/registry/v2``) keys and values
  are read by Apicurio's ``AvroConverter`` instead (``[kafka] format = "avro"``), from a plugin
  folder of its own. It is ``apicurio-registry-utils-converter`` 2.6: the Maven Central
  reachable here serves the 3.x POMs but not the jars (3.3.3) or not their parent POM
  (3.0.9); 2.6 speaks the v2 API, which Apicurio 3 keeps. It reads the Confluent framing pgrouter writes (``as-confluent``:
  a 4-byte id after byte 0) and takes that id for a content id, which is what the registry's
  Confluent-compatible API hands out. Kafka's and SLF4J's jars are the worker's.
* Kafka's own ``FileStreamSinkConnector`` (``connect-file`` of the broker's version, alone in
  a plugin folder) writes each record as the worker's converter parsed it, one line per
  record: a reader of pgrouter's records that is Kafka Connect and nothing else.
* ``python -m devstack up --connect`` (``make stack``) fetches every jar here (``fetch_all``),
  so the tests find them on a fresh machine; the tests fetch what is missing on first use.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

from actors.services.maven import KAFKA_VERSION
from .process import StackError

JDBC_SINK_VERSION = "3.6.0.Final"
HIBERNATE_AGROAL_VERSION = "7.2.0.Final"
APICURIO_CONVERTER_VERSION = "2.6.13.Final"
AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
CENTRAL = "https://repo.maven.apache.org/maven2"

_WORKER_DEPS = [("org.apache.kafka", "connect-runtime", KAFKA_VERSION),
                ("org.apache.kafka", "connect-json", KAFKA_VERSION),
                ("org.slf4j", "slf4j-simple", "1.7.36")]
_DROP = ("jackson-", "mariadb-", "mssql-", "mysql-", "ojdbc")


def _dep(g: str, a: str, v: str, exclusions: str = "") -> str:
    return (f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
            f"<version>{v}</version>{exclusions}</dependency>")


def _excl(*pairs: tuple[str, str]) -> str:
    return ("<exclusions>" + "".join(f"<exclusion><groupId>{g}</groupId><artifactId>{a}"
                                      "</artifactId></exclusion>" for g, a in pairs)
            + "</exclusions>")


def _pom(name: str, deps: str) -> str:
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0'
            f"</modelVersion><groupId>pgrouter.devstack</groupId><artifactId>{name}"
            f"</artifactId><version>1</version><packaging>pom</packaging><dependencies>{deps}"
            "</dependencies></project>")


POMS = {
    "connect": _pom("connect", "".join(_dep(*d) for d in _WORKER_DEPS)),
    "jdbc-sink": _pom("jdbc-sink", _dep(
        "io.debezium", "debezium-connector-jdbc", JDBC_SINK_VERSION,
        _excl(("org.hibernate", "hibernate-agroal"), ("org.hibernate.orm", "hibernate-agroal"),
              ("io.agroal", "*"))) + _dep(
        "org.hibernate.orm", "hibernate-agroal", HIBERNATE_AGROAL_VERSION,
        _excl(("org.hibernate.orm", "hibernate-core")))),
    "connect-file": _pom("connect-file", _dep("org.apache.kafka", "connect-file", KAFKA_VERSION)),
    "avro-converter": _pom("avro-converter", _dep(
        "io.apicurio", "apicurio-registry-utils-converter", APICURIO_CONVERTER_VERSION,
        _excl(("org.apache.kafka", "*"), ("org.slf4j", "*")))),
}
_SETTINGS = (f"<settings><mirrors><mirror><id>central-only</id><mirrorOf>*</mirrorOf>"
             f"<url>{CENTRAL}</url></mirror></mirrors></settings>")


def _fetch(name: str, target: pathlib.Path, work: pathlib.Path) -> pathlib.Path:
    """``target`` holding ``name``'s jars; one process at a time fetches (tests on two
    workers may ask at once: one would remove what the other is filling)."""
    import fcntl

    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _fetch_locked(name, target, work)


def _fetch_locked(name: str, target: pathlib.Path, work: pathlib.Path) -> pathlib.Path:
    stamp = target / ".complete"
    if stamp.exists() and stamp.read_text() == POMS[name]:
        return target
    if shutil.which("mvn") is None or shutil.which("java") is None:
        raise StackError("Kafka Connect needs Maven and Java (apt-get install maven "
                         "openjdk-17-jre-headless)")
    if target.exists():
        shutil.rmtree(target)
    work.mkdir(parents=True, exist_ok=True)
    (work / "pom.xml").write_text(POMS[name])
    (work / "settings.xml").write_text(_SETTINGS)
    args = ["mvn", "-q", "-B", "-s", str(work / "settings.xml"), "-f", str(work / "pom.xml"),
            "dependency:copy-dependencies", f"-DoutputDirectory={target}",
            "-DincludeScope=runtime"]
    if name == "jdbc-sink":
        args.append("-DexcludeGroupIds=org.apache.kafka")  # the worker's own
    if name == "connect-file":
        args.append("-DexcludeTransitive=true")  # connect-api and SLF4J: the worker's
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise StackError(f"mvn could not fetch the {name} jars:\n  " + "\n  ".join(tail))
    for jar in target.glob("*.jar"):
        if name == "jdbc-sink" and jar.name.startswith(_DROP):
            jar.unlink()
    stamp.write_text(POMS[name])
    return target


_PLUGINS = {"jdbc-sink": "debezium-jdbc", "avro-converter": "apicurio-avro",
            "connect-file": "connect-file"}


def fetch(cache: pathlib.Path, *, avro: bool = False,
          plugins: tuple[str, ...] = ("jdbc-sink",)) -> tuple[pathlib.Path, pathlib.Path]:
    """(the worker's jars, the plugin path holding ``plugins`` (``_PLUGINS``) and, with
    ``avro``, Apicurio's Avro converter), fetched on first use."""
    cache = cache.resolve()
    lib = _fetch("connect", cache / "jars" / "connect", cache / "poms" / "connect")
    path = cache / "jars" / "connect-plugins"
    for name in plugins + (("avro-converter",) if avro else ()):
        _fetch(name, path / _PLUGINS[name], cache / "poms" / name)
    return lib, path


def fetch_all(cache: pathlib.Path) -> pathlib.Path:
    """Every Connect jar the tests use (``python -m devstack up --connect``); the plugin path."""
    return fetch(cache, plugins=tuple(_PLUGINS))[1]


def apicurio_api(ccompat_url: str) -> str:
    """The core (v2) API of the Apicurio Registry whose Confluent-compatible API is
    ``ccompat_url`` (``http://host:port/apis/ccompat/v7``)."""
    base, sep, _ = ccompat_url.rstrip("/").rpartition("/apis/ccompat/")
    if not sep:
        raise StackError(f"{ccompat_url}: not an Apicurio Registry's Confluent-compatible API "
                         "(…/apis/ccompat/v7)")
    return base + "/apis/registry/v2"


def avro_converter_properties(registry: str) -> dict[str, str]:
    """Worker properties reading Confluent-framed Avro with Apicurio's converter from the
    registry's core API ``registry`` (``apicurio_api``)."""
    out = {}
    for side in ("key", "value"):
        p = f"{side}.converter"
        out |= {p: AVRO_CONVERTER, f"{p}.apicurio.registry.url": registry,
                f"{p}.apicurio.registry.as-confluent": "true",
                f"{p}.apicurio.registry.use-id": "contentId",
                f"{p}.apicurio.registry.headers.enabled": "false"}
    return out


def file_sink(name: str, topics: list[str], out: pathlib.Path, **extra: str) -> dict[str, str]:
    """A ``FileStreamSinkConnector`` writing each record's value, as the worker's converter
    parsed it (``toString``), to ``out``; ``extra``: more properties (transforms)."""
    return {"name": name,
            "connector.class": "org.apache.kafka.connect.file.FileStreamSinkConnector",
            "tasks.max": "1", "topics": ",".join(topics), "file": str(out), **extra}


def _props(values: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


class ConnectStandalone:
    """One standalone worker running one JDBC sink connector; ``start``/``stop``. Records are
    Connect JSON, or Avro read through ``registry`` (``apicurio_api``) when given."""

    def __init__(self, cache: pathlib.Path, workdir: pathlib.Path, *, bootstrap: str,
                 topics: list[str], jdbc_url: str = "", user: str = "postgres",
                 password: str = "", registry: str | None = None,
                 name: str = "pgrouter-jdbc-sink", connectors: list[dict] | None = None):
        self.cache, self.workdir, self.registry = cache, workdir, registry
        # other connectors than the JDBC sink (``file_sink``): each a properties dict
        self.connectors = connectors
        self.name = name  # the sink's consumer group is connect-<name>
        self.bootstrap, self.topics = bootstrap, topics
        self.jdbc_url, self.user, self.password = jdbc_url, user, password
        self.proc: subprocess.Popen | None = None
        self.log = workdir / "connect.log"

    def worker_properties(self, plugins: pathlib.Path) -> dict[str, str]:
        converter = "org.apache.kafka.connect.json.JsonConverter"
        converters = (avro_converter_properties(self.registry) if self.registry else
                      {"key.converter": converter, "value.converter": converter,
                       "key.converter.schemas.enable": "true",
                       "value.converter.schemas.enable": "true"})
        return {"bootstrap.servers": self.bootstrap, **converters,
                "offset.storage.file.filename": str(self.workdir / "offsets"),
                "offset.flush.interval.ms": "1000", "plugin.path": str(plugins),
                "listeners": "http://127.0.0.1:0",
                "consumer.isolation.level": "read_committed",
                "consumer.auto.offset.reset": "earliest"}

    def connector_properties(self) -> dict[str, str]:
        return {"name": self.name,
                "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
                "tasks.max": "1", "topics": ",".join(self.topics),
                "connection.url": self.jdbc_url, "connection.username": self.user,
                "connection.password": self.password, "insert.mode": "upsert",
                "delete.enabled": "true", "truncate.enabled": "true",
                "primary.key.mode": "record_key", "schema.evolution": "basic",
                "collection.name.format": "${topic}"}

    def start(self) -> None:
        lib, plugins = fetch(self.cache, avro=self.registry is not None,
                             plugins=("jdbc-sink",) if self.connectors is None else
                             ("connect-file",))
        self.workdir.mkdir(parents=True, exist_ok=True)
        worker = self.workdir / "worker.properties"
        worker.write_text(_props(self.worker_properties(plugins)))
        files = []
        for props in self.connectors or [self.connector_properties()]:
            files.append(self.workdir / f"{props['name']}.properties")
            files[-1].write_text(_props(props))
        self.proc = subprocess.Popen(
            ["java", "-Xmx384m", "-cp", f"{lib}/*",
             "org.apache.kafka.connect.cli.ConnectStandalone", str(worker), *map(str, files)],
            stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def task_failed(self) -> bool:
        """True once the connector's task died (the worker lives on without it)."""
        return self.log.exists() and b"unrecoverable exception" in self.log.read_bytes()

    def stop(self, timeout: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
