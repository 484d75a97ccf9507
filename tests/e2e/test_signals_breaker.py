"""A breaker's signals on the real stack: a ``where`` that passes the check but that
PostgreSQL cannot evaluate on some row (``id / 0 > 1``: division by zero;
``id * 2147483647 > 0``: integer out of range) fails its own backfill — one warning line, the job and the signal
recorded ``failed`` with the problem — and the stream and the other signals go on. (It was a
transient failure: the pipeline restarted, resumed the job, failed again, for ever, with a
growing backoff; ``--until-caught-up`` returned without it.)"""

from __future__ import annotations

import pytest

from tests.e2e.test_signals import (SIGNAL, setup, signal_states, signal_summary, snapshot_ids,
                                    teardown)
from tests.helpers import read_topic, run_router, unique

pytestmark = pytest.mark.services


def test_a_where_postgres_cannot_evaluate_fails_its_backfill_alone(pg_dsn, kafka_bootstrap,
                                                                  tmp_path):
    name = unique("sgw")
    pg, cfg = setup(pg_dsn, kafka_bootstrap, tmp_path, name)
    try:
        run_router(cfg)  # the slot, no snapshot
        pg.run(SIGNAL, name, f"public.{name}", name, "id / 0 > 1")
        pg.run(SIGNAL, name, f"public.{name}", name, "id * 2147483647 > 0")
        pg.run(SIGNAL, name, f"public.{name}", name, "id > 55")  # after both: runs
        pg.run(f"insert into {name} values (1000, 'streamed')")
        done = run_router(cfg, timeout=180)
        err = done.stderr
        assert "restarting" not in err and "Traceback" not in err, err[-3000:]
        assert err.count("backfill failed: its where cannot be evaluated") == 2, err[-3000:]
        assert "division by zero" in err and "integer out of range" in err, err[-3000:]
        assert snapshot_ids(kafka_bootstrap, name) == [*range(56, 61), 1000], err[-3000:]
        assert [r["value"]["after"]["id"] for r in read_topic(kafka_bootstrap, name)
                if r["value"]["op"] == "c"] == [1000]
        states = sorted(s for s, _ in signal_states(kafka_bootstrap, name).values())
        assert states == ["accepted", "failed", "failed"], states
        assert signal_summary(cfg)["states"] == {"accepted": 1, "failed": 2}
        again = run_router(cfg)  # the failed jobs are not resumed
        assert "backfill" not in again.stderr, again.stderr[-3000:]
    finally:
        teardown(pg, name)
