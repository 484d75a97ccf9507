"""A breaker's signals on the real stack: a ``where`` that passes the check but that
PostgreSQL cannot evaluate on some row (``id / 0 > 1``: division by zero;
``id * 2147483647 > 0``: integer out of range) fails its own backfill — one warning line, the job and the signal
recorded ``failed`` with the problem — and the stream and the other signals go on. (It was a
transient failure: the pipeline restarted, resumed the job, failed again, for ever, with a
growing backoff; ``--until-caught-up`` returned without it.)"""

from __future__ import annotations

import pytest

from tests.e2e.sources import source_config
from tests.e2e.test_signals import (SIGNAL, setup, signal_source, signal_states, signal_summary,
                                    snapshot_ids, teardown)
from tests.helpers import read_topic, run_router, unique, wait_line

pytestmark = pytest.mark.services


def test_a_where_postgres_cannot_evaluate_fails_its_backfill_alone(pg_dsn, kafka_bootstrap,
                                                                  tmp_path):
    pg, name, cfg = signal_source(pg_dsn, kafka_bootstrap, tmp_path, "sgw")
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


def test_a_queued_signal_whose_table_is_dropped_while_the_router_is_down(
        pg_dsn, kafka_bootstrap, tmp_path):
    """A signal waits (queued) for the backfill of its table, which cannot read (locked); the
    router is killed; the table is dropped; at the next start the queued signal is planned
    again and finds no table: recorded ``refused`` with the problem (it was ``accepted``,
    with nothing to copy)."""
    import os
    import signal as signals

    import psycopg2

    from tests.helpers import start_router

    name = unique("sgd")
    pg, _ = setup(pg_dsn, kafka_bootstrap, tmp_path, name)
    pg.run(f"create table {name}_b (id int primary key)")
    pg.run(f"alter publication {name} add table {name}_b")
    cfg = source_config(tmp_path / "p.toml", pg_dsn, kafka_bootstrap, name,
                        extra='[snapshot]\nmode = "never"\n',
                        routes=f'[[routes]]\nname = "{name}"\npublication = "{name}"\n'
                               f'topic = "{name}.{{table}}"\n')
    log = tmp_path / "router.log"
    locker = psycopg2.connect(pg_dsn)
    router = None
    try:
        run_router(cfg)  # the slot, no snapshot
        with locker.cursor() as cur:
            cur.execute(f"lock table {name}_b in access exclusive mode")  # no chunk reads
        router = start_router(cfg, log)
        pg.run(SIGNAL, name, f"public.{name}_b", name, None)
        pg.run(SIGNAL, name, f"public.{name}_b", name, "id > 5")
        wait_line("signal queued", log, router)
        os.killpg(router.pid, signals.SIGKILL)
        router.wait(timeout=30)
        router = None
        locker.rollback()
        pg.run(f"drop table {name}_b")
        done = run_router(cfg)
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        states = signal_states(kafka_bootstrap, name)
        assert sorted(s for s, _ in states.values()) == ["accepted", "refused"], states
        assert any("not streamed" in p for s, p in states.values() if s == "refused"), states
    finally:
        if router is not None:
            os.killpg(router.pid, signals.SIGKILL)
            router.wait(timeout=30)
        locker.close()
        pg.run(f"drop table if exists {name}_b")
        teardown(pg, name)
