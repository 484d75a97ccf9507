"""``make demo``, the README's first command, run as a newcomer runs it: the dev stack's shop
workload through the router into the topics and on into Delta tables, compared with PostgreSQL.

The demo's closing comparison must say "identical" for every table it materializes, exit 0,
and leave no replication slot behind (an idle slot holds WAL on the server for good).

CI (``.ci/run``) runs ``make demo`` on the fresh clone right before ``make test`` and keeps its
output, its exit status on the last line, in the file ``PGROUTER_TEST_DEMO_OUTPUT`` names;
then this test checks that run, the same assertions on the same program's output and on the
same server, instead of running the demo a second time (about 50 s of Spark and router)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import psycopg2
import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.services, pytest.mark.spark]


def _demo() -> tuple[int, str]:
    """(exit status, output) of the demo: CI's ``make demo`` when it kept one, else a run."""
    kept = os.environ.get("PGROUTER_TEST_DEMO_OUTPUT")
    if kept:
        text = pathlib.Path(kept).read_text(errors="replace")
        last = re.search(r"\A(.*)^exit status (\d+)\n?\Z", text, re.M | re.S)
        assert last, f"{kept}: no 'exit status N' line at its end (see .ci/run)"
        return int(last.group(2)), last.group(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGROUTER_TEST_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "devstack.demo"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def test_demo_ends_with_identical_tables_and_no_slot_left(devstack):
    returncode, out = _demo()
    assert returncode == 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    verdicts = dict(re.findall(r"^== shop\.(\w+): PostgreSQL \| Delta .* — (\w+)$", out, re.M))
    assert verdicts == {"customers": "identical", "orders": "identical"}, out[-4000:]
    with psycopg2.connect(devstack.pg_dsn) as conn, conn.cursor() as cur:
        cur.execute("select count(*) from pg_replication_slots where slot_name = 'pgrouter_demo'")
        assert cur.fetchone()[0] == 0
