"""A class-data archive of the driver JVM (HotSpot AppCDS; ``[spark] class_archive``): the
≈12,000 classes a job loads (Spark, Delta, Kafka, Scala) are stored parsed and verified by one
run and mapped by the next, which start ≈2 s sooner and drain 5–10% faster from a fresh JVM
(README "Throughput") — what a scheduler's ``--available-now`` runs pay on every start.

Rules: only where the job starts the driver JVM itself (``pgrouter materialize``; under
spark-submit the JVM is running before the job's code). The archive's file name carries a
fingerprint of the java executable, pyspark, the jars and the driver's JVM options, so a changed
installation gets a new archive instead of one the JVM would refuse. A run without a matching
archive has the JVM write one when it exits (``ArchiveClassesAtExit``) under a temporary name of
its own, renamed into place after the JVM has exited (``finish``): concurrent first runs each
write their own and the last rename wins; a run killed before that leaves a temporary file that
the next run writing one removes. Standard library only (the job's bundle).
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
from dataclasses import dataclass

from ..services.pids import pid_alive


@dataclass
class Archive:
    path: str  # the archive, used when it exists
    options: str  # JVM options for this run
    writing: str | None = None  # temporary file this run's JVM writes at exit


def _stat(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return f"{path}:missing"
    return f"{path}:{st.st_size}:{st.st_mtime_ns}"


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java else "java"


def fingerprint(jars, java_options: str) -> str:
    import pyspark

    parts = [_stat(_java()), pyspark.__version__, os.path.dirname(pyspark.__file__),
             *sorted(_stat(j) for j in jars), java_options]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def plan(directory: str, jars, java_options: str) -> Archive:
    """The archive for a driver started with ``java_options`` and ``jars``: map it if it
    exists, else have this run's JVM write it."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"pgrouter-spark-{fingerprint(jars, java_options)}.jsa")
    if os.path.exists(path):
        return Archive(path, f"-XX:SharedArchiveFile={path}")
    for stale in glob.glob(f"{path}.*.tmp"):  # a first run killed before its rename
        pid = stale.rsplit(".", 2)[-2]
        if not pid.isdigit() or not pid_alive(int(pid)):
            try:
                os.unlink(stale)
            except OSError:
                pass
    writing = f"{path}.{os.getpid()}.tmp"
    # -Xlog:cds=error: the dump lists each class it leaves out (hundreds of lines) as a warning
    return Archive(path, f"-XX:ArchiveClassesAtExit={writing} -Xlog:cds=error", writing)


def finish(archive: Archive | None, spark) -> None:
    """After the job: a run writing the archive stops Spark and its JVM, whose exit writes the
    archive, and renames it into place. Nothing to do for a run that mapped one."""
    if archive is None or archive.writing is None:
        return
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    spark.stop()
    if proc is None:
        return
    gateway.shutdown()
    proc.stdin.close()  # the gateway's JVM exits when its stdin closes
    proc.wait(timeout=600)
    if proc.returncode == 0 and os.path.exists(archive.writing):
        os.replace(archive.writing, archive.path)
