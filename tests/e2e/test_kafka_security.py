"""``[kafka.settings]``'s connection settings reach the clients pgrouter's looks at Kafka open
(``status``, ``decode --topic``: ``actors.kafka.survey``). The dev stack's Kafka has one
PLAINTEXT listener, so the proof is the other way round: asked for TLS or SASL, they fail
within seconds with one line naming the protocol and the handshake that failed, where a
client that dropped the settings would read the plaintext broker as if nothing were asked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, unique, write_config

pytestmark = pytest.mark.services

PASSWORD = "hunter2-not-for-logs"
#: the survey's bootstrap wait (4 s) plus the CLI's start; far below kafka-python's 30 s
DEADLINE = 25


def pgrouter(*args):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "actors.cli", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    return proc, time.monotonic() - start


def config(tmp_path, pg_dsn, kafka_bootstrap, settings: str):
    name = unique("sec")  # nothing is created: the slot and table need not exist
    return write_config(tmp_path / "router.toml", dsn=pg_dsn, slot=name, publications=[name],
                        bootstrap=kafka_bootstrap, kafka_extra=f"[kafka.settings]\n{settings}",
                        routes=f'[[routes]]\nname = "r"\ntables = ["public.{name}"]\n')


def test_status_speaks_tls_when_the_config_asks_for_it(tmp_path, pg_dsn, kafka_bootstrap):
    cfg = config(tmp_path, pg_dsn, kafka_bootstrap, 'security_protocol = "SSL"\n')
    proc, took = pgrouter("status", "-c", str(cfg), "--json")
    assert took < DEADLINE, took
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    kafka = [p for p in report["problems"] if p.startswith("kafka.")]
    assert len(kafka) == 1 and "\n" not in kafka[0], report["problems"]
    assert kafka_bootstrap in kafka[0] and "security_protocol SSL" in kafka[0], kafka[0]
    assert "Handshake failed" in kafka[0] and "[SSL" in kafka[0], kafka[0]
    assert report["routes"] == {}


def test_decode_speaks_sasl_and_never_shows_the_password(tmp_path, pg_dsn, kafka_bootstrap):
    cfg = config(tmp_path, pg_dsn, kafka_bootstrap,
                 'security_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "PLAIN"\n'
                 f'sasl_plain_username = "pgrouter"\nsasl_plain_password = "{PASSWORD}"\n')
    proc, took = pgrouter("decode", "-c", str(cfg), "--topic", "any.topic")
    assert took < DEADLINE, took
    assert proc.returncode != 0 and proc.stdout == "", proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("pgrouter decode:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    # the plaintext listener refuses the SASL handshake (ILLEGAL_SASL_STATE)
    assert "security_protocol SASL_PLAINTEXT, sasl_mechanism PLAIN" in lines[0], lines[0]
    assert "IllegalSaslState" in lines[0], lines[0]
    assert PASSWORD not in proc.stdout + proc.stderr
