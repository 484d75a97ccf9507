"""``pgrouter --version`` prints what a bug report needs: pgrouter, Python, whether the C hot
path is active (it follows PGROUTER_PURE_PYTHON), the Kafka clients with librdkafka's own
version, and the PostgreSQL drivers with psycopg2's libpq."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys

from router import __version__
from tests.conftest import ROOT


def version_lines(pure: bool) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PGROUTER_PURE_PYTHON"}
    if pure:
        env["PGROUTER_PURE_PYTHON"] = "1"
    done = subprocess.run([sys.executable, "-m", "actors.cli", "--version"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env=env)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout.splitlines()


def test_version_names_what_a_bug_report_needs():
    lines = version_lines(pure=False)
    assert lines[0] == f"pgrouter {__version__}"
    assert lines[1].startswith(f"python {platform.python_version()} ")
    built = importlib.util.find_spec("router._native") is not None
    assert lines[2] == ("hot path: native (router._native)" if built else
                        "hot path: python (the C accelerator is not built or "
                        "PGROUTER_PURE_PYTHON is set)")
    assert f"kafka-python {importlib.metadata.version('kafka-python')}" in lines
    psycopg = [ln for ln in lines if ln.startswith("psycopg2 ")]
    assert psycopg and "(libpq " in psycopg[0]
    try:
        import confluent_kafka
    except ImportError:
        assert "confluent-kafka: not installed" in lines
    else:
        assert (f"confluent-kafka {importlib.metadata.version('confluent-kafka')} "
                f"(librdkafka {confluent_kafka.libversion()[0]})") in lines


def test_version_says_when_the_hot_path_is_python():
    assert version_lines(pure=True)[2].startswith("hot path: python")
