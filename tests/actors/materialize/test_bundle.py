"""The materializer's spark-submit bundle: the job imports from the zip alone (of ``router``
only its array parser and error tree, of ``actors/kafka`` the registry client; no msgspec), and ``spark-submit --py-files BUNDLE actors/materialize/job.py`` starts it."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from actors.materialize.bundle import write_bundle

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_bundle_holds_the_job_and_nothing_of_the_core(tmp_path):
    zip_path = write_bundle(tmp_path / "b.zip")
    names = set(zipfile.ZipFile(zip_path).namelist())
    assert "actors/materialize/job.py" in names and "actors/materialize/merge.py" in names
    assert {n for n in names if n.startswith("router/")} == {"router/__init__.py",
                                                             "router/postgres/__init__.py",
                                                             "router/postgres/arrays.py",
                                                             "router/errors.py"}
    assert {n for n in names if n.startswith("actors/kafka/")} == {"actors/kafka/__init__.py",
                                                                   "actors/kafka/registry.py"}
    assert not any(n.endswith("config.py") for n in names)
    # imported from the zip first on sys.path (as --py-files puts it), the job loads without
    # the rest of router/ or msgspec: a module the bundle lacks would fail here
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); sys.modules['msgspec'] = None; "
             "import actors.materialize.job as j, router.postgres.arrays as a; "
             "import actors.kafka.registry as r; assert r.__file__.startswith(sys.argv[1]); "
             "assert j.__file__.startswith(sys.argv[1]), j.__file__; "
             "assert a.__file__.startswith(sys.argv[1]), a.__file__; "
             "assert j.Materializer.__module__ == 'actors.materialize.merge'")
    proc = subprocess.run([sys.executable, "-c", probe, str(zip_path)], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.spark
def test_spark_submit_runs_the_job_file(tmp_path):
    spark_submit = shutil.which("spark-submit", path=os.path.dirname(sys.executable))
    assert spark_submit, "pyspark's spark-submit is not installed in this environment"
    zip_path = write_bundle(tmp_path / "b.zip")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run([spark_submit, "--master", "local[1]", "--py-files", str(zip_path),
                           str(ROOT / "actors/materialize/job.py"), "--config",
                           str(tmp_path / "missing.toml")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    # the job's own entry point ran (its one-line error), not an import failure
    out = proc.stdout + proc.stderr  # spark-submit passes the job's stderr on as stdout
    assert proc.returncode == 1, out[-2000:]
    assert "pgrouter materialize: cannot read" in out, out[-2000:]
