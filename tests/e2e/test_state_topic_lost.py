"""The snapshot state topic lost: deleted between two runs while the initial snapshot was
half done; and the warning of ``pgrouter check`` for a state (or committed-LSN) topic that
is not compacted, whose records would expire the same way.

The only record that an initial snapshot was started and not finished is the ``started``
record in ``[snapshot] state_topic``. With the topic gone, the next start used to find the
slot, no record of a snapshot, start streaming from the consistent point and say "caught
up" (exit 0): the tables the killed router had not copied yet were never copied (found by a
breaker with a plain read_committed consumer and ``SELECT`` as the oracle: 3,000 of 3,000
rows of the second table missing, both delivery modes). Now a start that finds its slot and
no state topic at all cannot know whether the snapshot finished: it says so in one warning
line and finishes it as a backfill of every routed table."""

from __future__ import annotations

import time

import psycopg2
import pytest

from tests.helpers import (Pg, fold_rows, kill9, read_topic, run_router, start_router,
                           unique, write_config)

pytestmark = pytest.mark.services


def _wait(cond, what: str, proc, log, timeout: float = 90, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None and time.monotonic() < deadline, \
            f"{what}: " + log.read_text(errors="replace")[-3000:]
        time.sleep(interval)


@pytest.mark.parametrize("exactly_once,client", [(False, "librdkafka"), (True, "librdkafka"),
                                                 (False, "kafka-python")])
def test_state_topic_deleted_after_a_half_done_initial_snapshot(
        pg_dsn, kafka_bootstrap, tmp_path, exactly_once, client):
    from confluent_kafka.admin import AdminClient

    pg = Pg(pg_dsn)
    name = unique("stl")
    a, b, state = f"{name}_a", f"{name}_b", f"{name}.state"
    for t, n in ((a, 200_000), (b, 3000)):
        pg.run(f"create table {t} (id int primary key, v text)")
        pg.run(f"insert into {t} select g, 'v' from generate_series(1, {n}) g")
    pg.run(f"create publication {name} for table {a}, {b}")
    routes = "".join(f'[[routes]]\nname = "{t}"\ntables = ["public.{t}"]\ntopic = "{{route}}"\n'
                     for t in (a, b))
    cfg = write_config(tmp_path / "r.toml", dsn=pg_dsn, slot=name, publications=[name],
                       bootstrap=kafka_bootstrap, routes=routes,
                       kafka_extra=f'client = "{client}"'
                                   + ("\nexactly_once = true" if exactly_once else ""),
                       extra=f'[snapshot]\nmode = "initial"\nparallel = 1\n'
                             f'state_topic = "{state}"\n')
    log = tmp_path / "r.log"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    router = start_router(cfg, log)
    lock = psycopg2.connect(pg_dsn)
    try:
        with lock.cursor() as cur:
            # the copy of b cannot start: a is copied, b is not. Locked as soon as a reader
            # locked a (a is read first and long enough to take b's lock before it is done)
            def reading_a() -> bool:
                cur.execute("select count(*) from pg_locks where relation = %s::regclass "
                            "and pid <> pg_backend_pid()", (a,))
                held = cur.fetchone()[0] > 0
                lock.rollback()
                return held
            _wait(reading_a, "a not read", router, log, interval=0.005)
            cur.execute(f"lock table {b} in access exclusive mode")
        a_done = {"kind": "backfill", "slot": name, "route": a, "table": f"public.{a}"}
        _wait(lambda: any(r["key"] == a_done and r["value"]["state"] == "done"
                          for r in read_topic(kafka_bootstrap, state, settle=0,
                                              missing_ok=True)), "a not done", router, log)
        kill9(router)
        lock.rollback()
        copied = fold_rows(read_topic(kafka_bootstrap, b, settle=0, missing_ok=True), ["id"])
        assert len(copied) < 3000, "the first run copied the second table: nothing to lose"
        admin.delete_topics([state])[state].result()
        deadline = time.monotonic() + 30
        while state in admin.list_topics(timeout=10).topics:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        done = run_router(cfg)
        rows = fold_rows(read_topic(kafka_bootstrap, b, settle=0, missing_ok=True), ["id"])
        assert len(rows) == 3000, "the second table's rows never reached its topic"
        assert len(fold_rows(read_topic(kafka_bootstrap, a, settle=0), ["id"])) == 200_000
        warned = [line for line in done.stderr.splitlines()
                  if "the snapshot state topic was missing" in line]
        assert len(warned) == 1 and state in warned[0], done.stderr[-3000:]
        # recorded: a later start neither copies again nor streams past a gap
        states = read_topic(kafka_bootstrap, state, settle=0)
        initial = [r["value"]["state"] for r in states
                   if r["key"] == {"kind": "initial", "slot": name}]
        assert initial[-2:] == ["started", "done"], initial
    finally:
        lock.close()
        kill9(router)
        pg.drop_slot(name)
        pg.run(f"drop publication if exists {name}")
        for t in (a, b):
            pg.run(f"drop table if exists {t}")
        pg.close()
        gone = [t for t in (a, b, state) if t in admin.list_topics(timeout=10).topics]
        if gone:
            for f in admin.delete_topics(gone).values():
                f.result()


def test_check_warns_of_a_state_topic_that_is_not_compacted(pg_dsn, kafka_bootstrap, tmp_path):
    """The state topic and (exactly-once) the committed-LSN topic made by hand with
    ``cleanup.policy=delete``: their records expire, which loses what the test above loses
    (or the committed LSN). ``pgrouter check`` and the start name each in a warning line;
    they were not asked about at all."""
    import subprocess
    import sys

    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.helpers import ROOT

    pg = Pg(pg_dsn)
    name = unique("stc")
    state, committed = f"{name}.state", f"{name}.committed"
    pg.run(f"create table {name} (id int primary key)")
    pg.run(f"create publication {name} for table {name}")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for f in admin.create_topics([NewTopic(t, 1, 1, config={"cleanup.policy": "delete"})
                                  for t in (state, committed)]).values():
        f.result()
    cfg = write_config(tmp_path / "r.toml", dsn=pg_dsn, slot=name, publications=[name],
                       bootstrap=kafka_bootstrap,
                       routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
                              f'topic = "{{route}}"\n',
                       kafka_extra=f'exactly_once = true\ncommitted_lsn_topic = "{committed}"',
                       extra=f'[snapshot]\nstate_topic = "{state}"\n')
    try:
        check = subprocess.run([sys.executable, "-m", "actors.cli", "check", "-c", str(cfg)],
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
        lines = check.stdout.splitlines()
        for path, topic in (("snapshot.state_topic", state),
                            ("kafka.committed_lsn_topic", committed)):
            assert any(line.startswith(f"{path}: warning: topic {topic!r} exists with "
                                       "cleanup.policy=delete") for line in lines), check
        assert "Traceback" not in check.stderr, check.stderr
    finally:
        pg.run(f"drop publication if exists {name}")
        pg.run(f"drop table if exists {name}")
        pg.close()
        for f in admin.delete_topics([state, committed]).values():
            f.result()
