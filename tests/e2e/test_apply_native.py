"""``pgrouter apply``'s conflict policies against PostgreSQL's own apply worker, on the same
changes and the same target rows (PostgreSQL 18 detects and counts conflicts:
``pg_stat_subscription_stats``).

For every conflict kind one source database, one target database with a native
subscription (``copy_data = false``, ``disable_on_error``) and one per pgrouter policy, all
holding the same rows before. The native outcome (rows, counter, stopped or not) is asserted
too, so the side-by-side table in the docs is checked here:

* ``error`` stops where the apply worker stops (it errors on ``insert_exists`` and
  ``update_exists``), and, unlike it, also on ``update_missing`` / ``delete_missing``;
* ``skip`` ends where the apply worker ends for the kinds it skips (``update_missing``,
  ``delete_missing``), and skips the row where the worker errors;
* ``upsert`` writes the incoming row where it can (an existing key, a missing old row).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid

import pytest

from devstack.configs import toml
from tests.e2e.test_multimaster import ROOT, sql, until_caught_up

pytestmark = pytest.mark.services

TARGET_DDL = "create table users (id int primary key, email text unique)"

#: kind -> (source rows before anyone reads, target rows before, source transactions)
SCENARIOS = {
    "insert_exists": ([], [(1, "a@x")],
                      ["insert into users values (1, 'src@x')",
                       "insert into users values (2, 'b@x')"]),
    "insert_exists_unique": ([], [(1, "dup@x")],
                             ["insert into users values (10, 'dup@x'), (11, 'ok@x')",
                              "insert into users values (12, 'c@x')"]),
    "update_exists": ([], [(1, "dup@x")],
                      ["insert into users values (11, 'ok@x')",
                       "update users set email = 'dup@x' where id = 11",
                       "insert into users values (12, 'c@x')"]),
    "missing": ([(5, "e@x"), (6, "f@x")], [],
                ["update users set email = 'e2@x' where id = 5",
                 "delete from users where id = 6",
                 "insert into users values (7, 'g@x')"]),
}

#: kind -> outcome: (rows, stopped, {conflict counter: n}); native and each policy
EXPECTED = {
    "insert_exists": {
        "native": ([(1, "a@x")], True, {"insert_exists": 1}),
        "error": ([(1, "a@x")], True, {}),
        "skip": ([(1, "a@x"), (2, "b@x")], False, {"insert_exists": 1}),
        "upsert": ([(1, "src@x"), (2, "b@x")], False, {"insert_exists": 1}),
    },
    "insert_exists_unique": {
        "native": ([(1, "dup@x")], True, {"insert_exists": 1}),
        "error": ([(1, "dup@x")], True, {}),
        "skip": ([(1, "dup@x"), (11, "ok@x"), (12, "c@x")], False, {"insert_exists": 1}),
        "upsert": ([(1, "dup@x"), (11, "ok@x"), (12, "c@x")], False, {"insert_exists": 1}),
    },
    "update_exists": {
        "native": ([(1, "dup@x"), (11, "ok@x")], True, {"update_exists": 1}),
        "error": ([(1, "dup@x"), (11, "ok@x")], True, {}),
        "skip": ([(1, "dup@x"), (11, "ok@x"), (12, "c@x")], False, {"update_exists": 1}),
        "upsert": ([(1, "dup@x"), (11, "ok@x"), (12, "c@x")], False, {"update_exists": 1}),
    },
    "missing": {
        "native": ([(7, "g@x")], False, {"update_missing": 1, "delete_missing": 1}),
        "error": ([], True, {}),
        "skip": ([(7, "g@x")], False, {"update_missing": 1, "delete_missing": 1}),
        "upsert": ([(5, "e2@x"), (7, "g@x")], False, {"update_missing": 1,
                                                       "delete_missing": 1}),
    },
}
DEADLINE = 60


def users(dsn: str) -> list[tuple]:
    return sql(dsn, "select id, email from users order by id", fetch=True)


def native_outcome(src: str, dst: str, sub: str, last_lsn: str, kinds_seen: set) -> tuple:
    """Subscribe ``dst`` to ``src``'s publication; wait until it applied everything or
    disabled itself on an error; its rows, whether it stopped and its conflict counters
    (waited for until they name ``kinds_seen``: the worker's statistics of two conflicts
    may be flushed apart)."""
    sql(dst, f"create subscription {sub} connection '{src}' publication pubu with "
             f"(copy_data = false, create_slot = false, slot_name = '{sub}', "
             "disable_on_error = true)")
    try:
        deadline = time.monotonic() + DEADLINE
        while True:
            enabled, applied = sql(dst, "select s.subenabled, coalesce(o.remote_lsn >= "
                                        "%s::pg_lsn, false) from pg_subscription s left join "
                                        "pg_replication_origin_status o on o.external_id = "
                                        "'pg_' || s.oid where s.subname = %s", last_lsn, sub,
                                   fetch=True)[0]
            if not enabled or applied:
                break
            assert time.monotonic() < deadline, "the native subscription never settled"
            time.sleep(0.2)
        kinds = ("insert_exists", "update_exists", "update_missing", "delete_missing")
        counters: dict[str, int] = {}
        while True:  # statistics are flushed a moment after the worker counts
            row = sql(dst, f"select {', '.join('confl_' + k for k in kinds)} from "
                           "pg_stat_subscription_stats where subname = %s", sub, fetch=True)
            counters = {k: n for k, n in zip(kinds, row[0]) if n} if row else {}
            if (counters and set(counters) >= kinds_seen) or (
                    not kinds_seen and enabled and users(dst) == users(src)):
                break
            if time.monotonic() > deadline:
                break  # the comparison below shows what was counted
            time.sleep(0.2)
        # the worker retried a few times before disabling itself: one conflict, many counts
        return users(dst), not enabled, {k: 1 for k in counters}
    finally:
        sql(dst, f"alter subscription {sub} disable")
        sql(dst, f"alter subscription {sub} set (slot_name = none)")  # dropped with src
        sql(dst, f"drop subscription {sub}")


def pgrouter_outcome(tmp_path, kafka: str, prefix: str, dst: str, policy: str,
                     origin: str) -> tuple:
    cfg = tmp_path / f"apply-{policy}.toml"
    cfg.write_text(toml({
        "kafka": {"bootstrap_servers": kafka, "transactions_topic": f"{prefix}.tx",
                  "topics": [f"{prefix}.public.*"], "poll_timeout": 0.1},
        "target": {"dsn": dst, "origin": origin, "conflict": policy}}))
    proc = subprocess.run([sys.executable, "-m", "actors.cli", "apply", "-c", str(cfg),
                           "--until-caught-up", "--retry-timeout", "20"], cwd=ROOT,
                          capture_output=True, text=True, timeout=DEADLINE)
    stopped = proc.returncode != 0
    if stopped:
        assert "Traceback" not in proc.stderr and proc.stderr.splitlines()[-1].startswith(
            "pgrouter apply: "), proc.stderr[-3000:]
        return users(dst), True, {}
    line = [ln for ln in proc.stderr.splitlines() if "applier stopped" in ln][-1]
    counters = {k: int(n) for k, n in re.findall(r"conflicts_(\w+)=(\d+)", line)}
    return users(dst), False, counters


@pytest.mark.parametrize("kind", sorted(SCENARIOS))
def test_conflict_policies_against_the_native_apply_worker(node_db, kafka_bootstrap,
                                                           tmp_path, kind):
    before_src, before_dst, txns = SCENARIOS[kind]
    tag = uuid.uuid4().hex[:6]
    prefix = f"nat{tag}"
    src = node_db("pg2", "src")
    sql(src, "create table users (id int primary key, email text); "
             "create publication pubu for table users")
    for row in before_src:
        sql(src, "insert into users values (%s, %s)", *row)
    for slot in (prefix, f"sub{tag}"):  # before the changes: both read all of them
        sql(src, "select pg_create_logical_replication_slot(%s, 'pgoutput')", slot)
    targets = {}
    for who in ("native", "error", "skip", "upsert"):
        targets[who] = node_db("pg3", who)
        sql(targets[who], TARGET_DDL)
        for row in before_dst:
            sql(targets[who], "insert into users values (%s, %s)", *row)
    for stmt in txns:
        sql(src, stmt)
    last = sql(src, "select pg_current_wal_lsn()::text", fetch=True)[0][0]
    router = tmp_path / "router.toml"
    router.write_text(toml({
        "source": {"dsn": src, "slot": prefix, "publications": ["pubu"]},
        "kafka": {"bootstrap_servers": kafka_bootstrap, "transactions_topic": f"{prefix}.tx"},
        "routes": [{"name": "r", "tables": ["public.users"],
                    "topic": f"{prefix}.{{schema}}.{{table}}"}]}))
    until_caught_up("run", router)
    got = {"native": native_outcome(src, targets["native"], f"sub{tag}", last,
                                    set(EXPECTED[kind]["native"][2]))}
    for policy in ("error", "skip", "upsert"):
        origin = f"nat_{tag}_{policy}"
        node_db.origins.append((node_db.nodes["pg3"], origin))
        got[policy] = pgrouter_outcome(tmp_path, kafka_bootstrap, prefix, targets[policy],
                                       policy, origin)
    assert got == EXPECTED[kind]
