"""``pgrouter apply`` against the real stack: restarts that read only what is new, a source
transaction larger than the memory limit, and the upsert policy on a key change.
(Bidirectional convergence and ``kill -9`` are in ``test_multimaster.py``.)"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid

import pytest

from tests.e2e.test_multimaster import ROOT, Node, rows, sql, until_caught_up
from tests.helpers import peak_rss

pytestmark = pytest.mark.services


def stopped_line(stderr: str) -> dict[str, int]:
    line = [ln for ln in stderr.splitlines() if "applier stopped" in ln][-1]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)\b", line)}


def one_row_transactions(dsn: str, base: int, n: int) -> None:
    sql(dsn, f"""do $$ begin for i in {base}..{base + n - 1} loop
        insert into t values (i, 'v' || i, 0, 'd'); commit; end loop; end $$""")


@pytest.mark.parametrize("client", ["librdkafka", "kafka-python"])
def test_restart_reads_only_what_is_new(node_db, kafka_bootstrap, tmp_path, client):
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    ra, ab = a.router_config('origin = "none"'), b.apply_config(a)
    ab.write_text(ab.read_text().replace("[kafka]", f'[kafka]\nclient = "{client}"'))
    one_row_transactions(a.dsn, 1, 3000)
    until_caught_up("run", ra)
    first = stopped_line(until_caught_up("apply", ab))
    assert first["transactions"] == 3000 and first["fetched"] >= 3 * 3000  # BEGIN, row, END
    one_row_transactions(a.dsn, 5000, 5)
    until_caught_up("run", ra)
    second = stopped_line(until_caught_up("apply", ab))
    assert rows(a.dsn) == rows(b.dsn)
    assert second["transactions"] == 5
    # the restart sought to the offsets stored with the last applied transaction: it read the
    # new transactions' 15 records, not the 9,000 before them
    assert second["fetched"] == 15, second
    assert second["skipped"] == 0
    # nothing new since: the stored offsets are the topic's end, so it ends without a poll
    idle = until_caught_up("apply", ab)
    assert stopped_line(idle)["fetched"] == 0
    assert re.search(r"waited poll_s=0\.0 ", idle), idle
    # stored offsets gone (as after a first start with the origin's progress kept): the
    # topics are read again and everything the origin covers is skipped, and counted
    sql(b.dsn, "delete from public.pgrouter_apply_progress")
    third = stopped_line(until_caught_up("apply", ab))
    assert third["transactions"] == 0 and third["skipped"] == 3005
    assert rows(a.dsn) == rows(b.dsn)


def test_transaction_larger_than_memory_limit(node_db, kafka_bootstrap, tmp_path):
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    n = 20_000  # about 6 MB of records; the limit is 1 MiB
    sql(a.dsn, f"insert into t select g, repeat('v', 100) || g, g, 'd' "
               f"from generate_series(1, {n}) g")
    until_caught_up("run", a.router_config('origin = "none"'))
    cfg = b.apply_config(a)
    cfg.write_text(cfg.read_text().replace("[target]", "[target]\nmemory_limit = 1048576"))
    peak, code, err = peak_rss([sys.executable, "-m", "actors.cli", "apply", "-c", str(cfg),
                                "--until-caught-up"])
    assert code == 0, err[-3000:]
    stats = stopped_line(err)
    assert stats["spills"] >= 1 and stats["transactions"] == 1 and stats["changes"] == n
    assert rows(a.dsn) == rows(b.dsn)
    # the process's whole footprint (interpreter and libraries are most of it); the records
    # themselves would add well over 30 MB as Python objects
    assert peak < 300 * 1024 * 1024, peak


def test_upsert_update_moving_to_an_existing_key(node_db, kafka_bootstrap, tmp_path):
    """The old key is missing on the target and the new key exists: the incoming row wins."""
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    ra, ab = a.router_config('origin = "none"'), b.apply_config(a, "upsert")
    sql(a.dsn, "insert into t values (3, 'three', 0, 'y')")
    until_caught_up("run", ra)
    until_caught_up("apply", ab)
    sql(b.dsn, "delete from t where id = 3")  # the old key goes missing on the target …
    sql(b.dsn, "insert into t values (2, 'stale', 9, 'x')")  # … and the new key exists
    sql(a.dsn, "update t set id = 2, v = 'moved' where id = 3")
    until_caught_up("run", ra)
    stats = stopped_line(until_caught_up("apply", ab))
    assert rows(a.dsn) == rows(b.dsn) == [(2, "moved", 0, rows(a.dsn)[0][3])]
    assert stats["conflicts"] == 1 and stats["conflicts_update_missing"] == 1


@pytest.mark.parametrize("group_rows", [1, 1000])
def test_conflict_inside_a_batch_of_small_transactions(node_db, kafka_bootstrap, tmp_path,
                                                       group_rows):
    """The transaction that conflicts is applied change by change under the policy; those
    before it in the same round trip stay applied once, those after it go on. Grouped
    (``group_rows``), the group that failed is sent again one transaction at a time, so the
    one that conflicts is found the same way."""
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    sql(b.dsn, "insert into t values (50, 'mine', 7, 'd')")
    one_row_transactions(a.dsn, 1, 100)
    until_caught_up("run", a.router_config('origin = "none"'))
    stats = stopped_line(until_caught_up("apply", b.apply_config(a, "skip", group_rows)))
    assert stats["transactions"] == 100 and stats["scripts"] < 50  # many a round trip
    assert stats["slow"] == 1 and stats["conflicts_insert_exists"] == 1
    # target transactions (rows one wrote share its xmin): grouped, those after the conflict
    # share a few (the group before it was sent again one by one, to find it)
    made_by = sql(b.dsn, "select count(distinct xmin::text) from t where id > 50",
                  fetch=True)[0][0]
    assert made_by == 50 if group_rows == 1 else made_by < 5, made_by
    expected = [r if r[0] != 50 else (50, "mine", 7, r[3]) for r in rows(a.dsn)]
    assert rows(b.dsn) == expected


@pytest.mark.parametrize("group_rows", [1, 1000])
def test_a_script_made_ahead_is_made_again_after_a_conflict(node_db, kafka_bootstrap, tmp_path,
                                                            group_rows):
    """The writer makes the next batch's script while the target runs the current one. When
    the current one fails (a conflict, here also on the last transaction of a batch: they
    are cut at most 1,000 transactions long, released 500 at a time), the script made ahead
    names prepared statements the failure dropped: it is made again, so the conflicts are
    the only transactions applied change by change and nothing is lost or applied twice."""
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    mine = (500, 1000, 1500, 2000)
    sql(b.dsn, "insert into t values " + ", ".join(f"({i}, 'mine', 7, 'd')" for i in mine))
    one_row_transactions(a.dsn, 1, 2500)
    until_caught_up("run", a.router_config('origin = "none"'))
    stats = stopped_line(until_caught_up("apply", b.apply_config(a, "skip", group_rows)))
    assert stats["transactions"] == 2500 and stats["ahead"] >= 2, stats
    assert stats["slow"] == stats["conflicts_insert_exists"] == len(mine), stats
    expected = [r if r[0] not in mine else (r[0], "mine", 7, r[3]) for r in rows(a.dsn)]
    assert rows(b.dsn) == expected


def test_apply_metrics_count_what_was_applied(node_db, kafka_bootstrap, tmp_path):
    """``[metrics] listen`` on the applier: /readyz while applying, and the applied
    transactions, changes and last commit time as Prometheus reads them."""
    import signal
    import time

    from tests.e2e.test_metrics import free_port, scrape, status_of, value, wait_for

    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    ra, ab = a.router_config('origin = "none"'), b.apply_config(a)
    port = free_port()
    ab.write_text(ab.read_text() + f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
    one_row_transactions(a.dsn, 1, 40)
    until_caught_up("run", ra)
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "actors.cli", "apply", "-c", str(ab)], cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: status_of(port, "/readyz") == 200, "the applier applying", 90)
        m = wait_for(lambda: (lambda m: m if value(m, "pgrouter_apply_transactions_total") == 40
                              else None)(scrape(port)), "40 applied transactions", 90)
        assert value(m, "pgrouter_apply_changes_total") == 40
        assert value(m, "pgrouter_apply_streaming") == 1
        last = value(m, "pgrouter_apply_last_commit_timestamp_seconds")
        assert started - 600 < last <= time.time() + 5
        assert value(m, "pgrouter_apply_origin_progress_lsn") > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert rows(a.dsn) == rows(b.dsn)


def test_initial_snapshot_and_backfill_are_applied(node_db, kafka_bootstrap, tmp_path):
    """Rows from before the router (its initial snapshot) and a ``pgrouter snapshot``
    backfill are upserts into the target: folded, the target equals the source."""
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    # the router makes the slot itself, so it copies the rows already there first
    sql(a.dsn, "select pg_drop_replication_slot(%s)", a.prefix)
    sql(a.dsn, "insert into t select g, 'old' || g, g, 'd' from generate_series(1, 5) g")
    ra, ab = a.router_config('origin = "none"'), b.apply_config(a)
    until_caught_up("run", ra)
    sql(a.dsn, "insert into t values (6, 'new6', 6, 'd'), (7, 'new7', 7, 'd')")
    sql(a.dsn, "update t set v = 'changed' where id = 2")
    sql(a.dsn, "delete from t where id = 4")
    until_caught_up("run", ra)
    stats = stopped_line(until_caught_up("apply", ab))
    assert rows(b.dsn) == rows(a.dsn) and len(rows(a.dsn)) == 6
    assert stats["snapshot_rows"] == 5 and stats["transactions"] == 3
    # the target drifts; a backfill of the route puts the source's rows back
    sql(b.dsn, "delete from t where id = 1")
    sql(b.dsn, "update t set v = 'drifted' where id = 3")
    asked = subprocess.run([sys.executable, "-m", "actors.cli", "snapshot", "-c", str(ra),
                            "--route", "r", "--table", "public.t"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert asked.returncode == 0, asked.stderr
    until_caught_up("run", ra)
    sql(a.dsn, "insert into t values (8, 'after', 8, 'd')")
    until_caught_up("run", ra)
    stats = stopped_line(until_caught_up("apply", ab))
    assert stats["snapshot_rows"] == 6, stats
    assert rows(b.dsn) == rows(a.dsn) and len(rows(a.dsn)) == 7


WIDE = ("create table w (id int primary key, i2 smallint, i8 bigint, num numeric(14,2), "
        "f8 float8, ok boolean, txt text, ts timestamptz, day date, u uuid, raw bytea, "
        "arr int[], span interval)")


def test_a_multi_row_insert_run_of_every_type_and_a_conflict_inside_it(
        node_db, kafka_bootstrap, tmp_path):
    """A 300-row insert transaction of every type is one statement on the fast path (values as the records
    carry them, NULLs every seventh row); a key the target holds already, in the middle of
    it, is reported as that transaction's conflict exactly as change by change does: under
    ``error`` one line naming table, key and transaction, the origin unmoved; under ``skip``
    the row is counted and the other 299 are applied once."""
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    for node in (a, b):
        sql(node.dsn, WIDE)
    sql(a.dsn, "alter publication pub add table w")
    sql(b.dsn, "insert into w (id, txt) values (150, 'mine')")
    ra = a.router_config('origin = "none"', f"""[[routes]]
name = "w"
tables = ["public.w"]
topic = "{a.prefix}.{{schema}}.{{table}}"
""")
    every_type = """insert into w select g, case when g % 7 <> 0 then g - 32768 end,
        case when g % 7 <> 0 then g * 10000000000 end, case when g % 7 <> 0 then g + 0.25 end,
        case when g % 7 <> 0 then g / 3.0 end, case when g % 7 <> 0 then g % 2 = 0 end,
        case when g % 7 <> 0 then 'it''s "' || g || E'"\\n\\\\ é' end,
        case when g % 7 <> 0 then '2026-01-02 03:04:05.123456+00'::timestamptz
                                  + g * interval '1 h' end,
        case when g % 7 <> 0 then date '2026-01-01' + g end,
        case when g % 7 <> 0 then md5(g::text)::uuid end,
        case when g % 7 <> 0 then decode(md5(g::text), 'hex') end,
        case when g % 7 <> 0 then array[g, null, -g] end,
        case when g % 7 <> 0 then g * interval '1 min 1.5 s' end
        from generate_series({lo}, {hi}) g"""
    sql(a.dsn, every_type.format(lo=1, hi=300))  # key 150 is on the target already
    sql(a.dsn, every_type.format(lo=301, hi=600))  # no conflict: the fast path
    sql(a.dsn, "insert into w (id, txt) values (1000, 'after')")
    until_caught_up("run", ra)
    xid = sql(a.dsn, "select xmin::text from w where id = 1", fetch=True)[0][0]
    cfg = b.apply_config(a)
    stopped = subprocess.run([sys.executable, "-m", "actors.cli", "apply", "-c", str(cfg),
                              "--until-caught-up"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
    assert stopped.returncode != 0 and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    last = stopped.stderr.splitlines()[-1]
    assert last.startswith("pgrouter apply: insert_exists on public.w key {'id': 150} "
                           f"(transaction {xid}:"), last
    # the failed transaction (the first) never moved the origin
    assert sql(b.dsn, "select pg_replication_origin_progress(%s, false)::text",
               a.origin_name, fetch=True) == [(None,)]
    assert sql(b.dsn, "select count(*) from w", fetch=True) == [(1,)]
    stats = stopped_line(until_caught_up("apply", b.apply_config(a, "skip")))
    assert stats["conflicts_insert_exists"] == 1 and stats["slow"] == 1
    assert stats["transactions"] == 3 and stats["changes"] == 601
    src = sql(a.dsn, "select w::text from w where id <> 150 order by id", fetch=True)
    assert sql(b.dsn, "select w::text from w where id <> 150 order by id", fetch=True) == src
    assert sql(b.dsn, "select txt from w where id = 150", fetch=True) == [("mine",)]
    # every seventh row's NULLs (85) and the last transaction's row came through as NULLs
    assert sql(b.dsn, "select count(*) from w where i2 is null and id <> 150",
               fetch=True) == [(86,)]


def test_grouped_updates_find_their_rows_by_the_key(node_db, kafka_bootstrap, tmp_path):
    """One-row updates grouped into one target transaction are one set-based UPDATE joined
    to the table on its key: each row is found by the key's index, as the apply worker
    finds it, and the table is never read whole (a hash join of a 1,000-row group read all
    20,000 rows of it, several times the server's work of the apply worker a change)."""
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    sql(a.dsn, "insert into t select g, 'v' || g, 0, 'd' from generate_series(1, 20000) g")
    ra, ab = a.router_config('origin = "none"'), b.apply_config(a, group_rows=1000)
    until_caught_up("run", ra)
    until_caught_up("apply", ab)
    sql(b.dsn, "analyze t")
    scans = ("select seq_scan, n_tup_upd from pg_stat_user_tables where relid = "
             "'public.t'::regclass")
    seq_before, upd_before = sql(b.dsn, scans, fetch=True)[0]
    sql(a.dsn, """do $$ begin for i in 1..1500 loop
        update t set n = n + 1 where id = 1 + (i * 7919) % 20000; commit; end loop; end $$""")
    until_caught_up("run", ra)
    stats = stopped_line(until_caught_up("apply", ab))
    assert stats["transactions"] == 1500 and stats["scripts"] < 10, stats
    # the applier's backend reports its counters as it exits: wait for its updates
    deadline = time.monotonic() + 30
    while (row := sql(b.dsn, scans, fetch=True)[0])[1] < upd_before + 1500:
        assert time.monotonic() < deadline, "the applier's table statistics never came"
        time.sleep(0.1)
    assert row[0] == seq_before, f"{row[0] - seq_before} scans of the whole table"
    assert rows(a.dsn) == rows(b.dsn)
