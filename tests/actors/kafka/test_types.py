"""mypy on the sink and the Kafka clients: each client implements the contracts it names
(``actors.kafka.contracts``: a method missing or with another signature is an error where
the client is built), and the sink calls only what its client's contracts declare."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
#: the sink, its record formats, and the clients behind the contracts
FILES = ["actors/kafka/__init__.py", "actors/kafka/contracts.py", "actors/kafka/kafka_python.py",
         "actors/kafka/librdkafka.py", "actors/kafka/transactional.py",
         "actors/kafka/fencing.py", "actors/pipeline/sink.py", "actors/pipeline/sink_schemas.py",
         "actors/pipeline/transactional_sink.py", "actors/pipeline/formats.py",
         "router/formats/record_format.py"]


def test_the_sink_and_the_clients_type_check_against_their_contracts(tmp_path):
    run = subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=silent",
                          "--ignore-missing-imports", "--no-error-summary",
                          f"--cache-dir={tmp_path}", *FILES],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "No module named mypy" not in run.stderr, "install the dev extras (mypy)"
    assert run.returncode == 0, run.stdout + run.stderr
