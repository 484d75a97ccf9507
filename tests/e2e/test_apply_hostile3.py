"""``pgrouter apply`` killed (``kill -9``) while the target runs a script of one-row
transactions, then started again: the target must equal the source, no row lost.

PostgreSQL advances a session's replication origin to the LSN given to
``pg_replication_origin_xact_setup`` also when the transaction aborts, and a backend whose
client is gone aborts the transaction it is in ("connection to client lost", at its next
interrupt check after a failed send). The fast path folds the setup into a one-row
transaction's statement and sends many ``begin; execute …; commit`` in one script, so the
transaction open when the server notices the dead client is aborted with the origin moved
past it; the restart skips it as applied."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.e2e.test_applier import one_row_transactions
from tests.e2e.test_multimaster import ROOT, Node, rows, sql, until_caught_up

pytestmark = pytest.mark.services

N = 20_000


def target_count(dsn: str) -> int:
    return sql(dsn, "select count(*) from t", fetch=True)[0][0]


@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_kill9_mid_script_loses_no_transaction(node_db, kafka_bootstrap, tmp_path, client):
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    ra, ab = a.router_config('origin = "none"'), b.apply_config(a, "error", 1)
    ab.write_text(ab.read_text().replace("[kafka]", f'[kafka]\nclient = "{client}"'))
    one_row_transactions(a.dsn, 1, N)
    until_caught_up("run", ra)
    for k in range(6):  # each kill lands inside a running script
        before = target_count(b.dsn)
        if before >= N:
            break
        with open(tmp_path / f"apply{k}.log", "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "actors.cli", "apply", "-c",
                                     str(ab)], cwd=ROOT, stdout=out, stderr=out)
            while target_count(b.dsn) < before + 300 + 500 * k and proc.poll() is None:
                time.sleep(0.005)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    until_caught_up("apply", ab)
    source, target = {r[0] for r in rows(a.dsn)}, {r[0] for r in rows(b.dsn)}
    assert sorted(source - target) == [], "transactions lost by the restart"
    assert rows(a.dsn) == rows(b.dsn)
