"""``pgrouter apply`` against a target that refuses changes, on the real stack.

* PostgreSQL itself: a transaction that set ``pg_replication_origin_xact_setup`` and then
  rolls back (or fails at COMMIT) still advances the origin; set up right before COMMIT,
  after the changes, it does not.
* A transaction the target refuses (a missing table, a value of the wrong type, a unique
  clash) stops the run with one line, and neither the origin nor the stored Kafka offsets
  move; once the target is fixed the next run applies it, and the target equals the source.
* A unique clash on a non-key column is a conflict of that row alone: ``skip`` and
  ``upsert`` count it, log it with its key and apply every other row; ``error`` stops with
  one line and applies nothing of that transaction.
"""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import psycopg2
import pytest

from tests.e2e.test_multimaster import ROOT, Node, sql, until_caught_up

pytestmark = pytest.mark.services


def apply_run(cfg, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "actors.cli", "apply", "-c", str(cfg),
                           "--until-caught-up", "--retry-timeout", "20"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def stats(stderr: str) -> dict[str, int]:
    line = [ln for ln in stderr.splitlines() if "applier stopped" in ln][-1]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)\b", line)}


def refusal(proc: subprocess.CompletedProcess) -> str:
    """The run failed with one clear line (no traceback); returns it."""
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("pgrouter apply: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def origin_state(dsn: str, origin: str) -> tuple:
    """The origin's progress and the offsets stored with it."""
    progress = sql(dsn, "select pg_replication_origin_progress(%s, false)::text from "
                        "pg_replication_origin where roname = %s", origin, origin, fetch=True)
    offsets = sql(dsn, "select commit_lsn::text, offsets::text from pgrouter_apply_progress "
                       "where origin = %s", origin, fetch=True) if sql(
        dsn, "select to_regclass('public.pgrouter_apply_progress')", fetch=True)[0][0] else []
    return (progress[0][0] if progress else None), offsets


def table_rows(dsn: str, table: str) -> list[tuple]:
    return sql(dsn, f"select * from {table} order by 1", fetch=True)


def test_postgres_advances_an_origin_past_a_rolled_back_transaction(node_db):
    """The PostgreSQL behaviour the applier is built around, in plain SQL."""
    dsn = node_db("pg3", "o")
    origin = f"probe_{uuid.uuid4().hex[:8]}"
    node_db.origins.append((node_db.nodes["pg3"], origin))
    sql(dsn, "create table u (id int primary key, email text unique)")
    sql(dsn, "create table d (id int primary key, email text unique deferrable initially "
             "deferred)")
    sql(dsn, "select pg_replication_origin_create(%s)", origin)
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()

    def progress() -> str:
        cur.execute("select pg_replication_origin_session_progress(false)::text")
        return cur.fetchone()[0]

    def attempt(*stmts):
        try:
            for s in stmts:
                cur.execute(s)
        except psycopg2.Error:
            cur.execute("rollback")
    try:
        cur.execute("select pg_replication_origin_session_setup(%s)", (origin,))
        attempt("begin", "insert into u values (1, 'a')",
                "select pg_replication_origin_xact_setup('0/100', now())", "commit")
        assert progress() == "0/100"
        # set up first, then a unique violation: the rollback moves the origin
        attempt("begin", "select pg_replication_origin_xact_setup('0/200', now())",
                "insert into u values (2, 'a')")
        assert progress() == "0/200"
        # an explicit ROLLBACK does too
        attempt("begin", "select pg_replication_origin_xact_setup('0/300', now())",
                "insert into u values (3, 'c')", "rollback")
        assert progress() == "0/300"
        # set up after the changes: a failing change never reaches it
        attempt("begin", "insert into u values (4, 'a')",
                "select pg_replication_origin_xact_setup('0/400', now())", "commit")
        assert progress() == "0/300"
        # a deferred constraint fails at COMMIT, after the setup: the origin moves …
        attempt("begin", "insert into d values (1, 'z'), (2, 'z')",
                "select pg_replication_origin_xact_setup('0/500', now())", "commit")
        assert progress() == "0/500"
        # … unless the deferred checks run before the setup
        attempt("begin", "insert into d values (1, 'z'), (2, 'z')",
                "set constraints all immediate",
                "select pg_replication_origin_xact_setup('0/600', now())", "commit")
        assert progress() == "0/500"
        assert table_rows(dsn, "u") == [(1, "a")] and table_rows(dsn, "d") == []
    finally:
        conn.close()


def test_an_origin_setup_folded_into_a_one_row_statement_moves_only_when_it_applied(node_db):
    """``router.apply.batches.with_origin`` on the server, the statements as the writer makes
    them: the setup inside a one-row insert, update or delete moves the origin when the
    change applied (and was committed), never when it failed: a duplicate key, a missing
    row, a foreign key (checked at the statement's end, after the projection: the table's
    triggers fail the statement before the setup)."""
    import json

    from actors.apply.target import progress_upsert
    from router.apply.batches import Prepared, statements, with_origin
    from router.apply.reassembly import _decode_data
    from router.apply.statements import TargetTable
    from router.config.applier import ApplyTarget

    dsn = node_db("pg3", "f")
    origin = f"fold_{uuid.uuid4().hex[:8]}"
    node_db.origins.append((node_db.nodes["pg3"], origin))
    sql(dsn, "create table u (id int primary key, v text); create table p (id int primary key);"
             "create table k (id int primary key references p, v text);"
             "create table prog (origin text primary key, commit_lsn pg_lsn not null, "
             "offsets jsonb not null, updated_at timestamptz not null default now())")
    target = ApplyTarget(dsn=dsn, origin=origin, progress_table="public.prog")
    sql(dsn, "select pg_replication_origin_create(%s)", origin)
    cols = {"id": "integer", "v": "text"}
    tables = {("public", "u"): TargetTable("public", "u", cols, ("id",), plain=True),
              # made plain on purpose: the statement's own guard must catch the trigger
              ("public", "k"): TargetTable("public", "k", cols, ("id",), plain=True)}
    prepared = Prepared()
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    lsn = [0x100]

    def apply(op: str, table: str, before, after) -> str:
        """One one-row transaction at the next LSN; the origin's progress after it."""
        lsn[0] += 0x100
        record = _decode_data(json.dumps({"op": op, "before": before, "after": after,
                                          "source": {"schema": "public", "table": table}}))
        (stmt,) = statements([("x", record)], tables, prepared)
        folded = with_origin(stmt, prepared, f"0/{lsn[0]:X}", "2026-01-01 00:00:00+00",
                             lambda at, offsets: progress_upsert(target, at, offsets),
                             '{"x": %d}' % lsn[0] if lsn[0] in (0x300, 0x400) else None)
        assert folded is not None
        for text in prepared.new:
            cur.execute(text)
        prepared.new = []
        try:
            cur.execute(f"begin; {folded}; commit")
        except psycopg2.Error:
            cur.execute("rollback")
        cur.execute("select pg_replication_origin_session_progress(false)::text")
        progress = cur.fetchone()[0]
        # the progress row moves with the origin, in the same statement
        cur.execute("select commit_lsn::text, offsets::text from prog")
        assert cur.fetchall() == [(progress, offsets[progress])]
        return progress
    # the offsets the row holds after each: 0/300 and 0/400 carry theirs, the others keep
    # the row's (the first one's insert: none)
    offsets = {"0/200": "{}", "0/400": '{"x": 1024}', "0/700": '{"x": 1024}'}
    try:
        cur.execute("select pg_replication_origin_session_setup(%s)", (origin,))
        assert apply("c", "u", None, {"id": 1, "v": "a"}) == "0/200"
        assert apply("c", "u", None, {"id": 1, "v": "b"}) == "0/200"  # duplicate key
        assert apply("u", "u", None, {"id": 1, "v": "c"}) == "0/400"
        assert apply("u", "u", None, {"id": 9, "v": "c"}) == "0/400"  # missing row
        assert apply("d", "u", {"id": 9}, None) == "0/400"  # missing row
        assert apply("d", "u", {"id": 1}, None) == "0/700"
        # the foreign key's check would fail after the setup: the guard stops it first,
        # for a parent that exists too
        assert apply("c", "k", None, {"id": 1, "v": "a"}) == "0/700"
        sql(dsn, "insert into p values (2)")
        assert apply("c", "k", None, {"id": 2, "v": "a"}) == "0/700"
        assert table_rows(dsn, "u") == [] and table_rows(dsn, "k") == []
    finally:
        conn.close()


SOURCE_DDL = """
create table items (id int primary key, v text);
create table nums (id int primary key, n text);
create table users (id int primary key, email text);
alter publication pub add table items, nums, users;
"""


def two_nodes(node_db, tmp_path, kafka_bootstrap):
    tag = uuid.uuid4().hex[:6]
    a = Node(node_db, "pg2", "a", tmp_path, kafka_bootstrap, tag)
    b = Node(node_db, "pg3", "b", tmp_path, kafka_bootstrap, tag)
    sql(a.dsn, SOURCE_DDL)
    cfg = a.router_config('origin = "none"')
    tables = '"public.t", "public.items", "public.nums", "public.users"'
    cfg.write_text(cfg.read_text().replace('tables = ["public.t"]', f'tables = [{tables}]'))
    return a, b, cfg


def test_failed_transactions_leave_the_origin_and_are_applied_after_the_fix(
        node_db, kafka_bootstrap, tmp_path):
    a, b, ra = two_nodes(node_db, tmp_path, kafka_bootstrap)
    # the target lacks items, has nums.n int, and users.email unique with a clash
    sql(b.dsn, "create table nums (id int primary key, n int); "
               "create table users (id int primary key, email text unique); "
               "insert into users values (1, 'dup@x')")
    # every transaction writes t first, so it has an xid and its abort a WAL record
    sql(a.dsn, "insert into t values (1, 'before', 0, 'd')")
    sql(a.dsn, "begin; insert into t values (2, 'T1', 0, 'd'); "
               "insert into items values (1, 'x'); commit")
    sql(a.dsn, "begin; insert into t values (3, 'T2', 0, 'd'); "
               "insert into nums values (1, 'abc'); commit")
    sql(a.dsn, "begin; insert into t values (4, 'T3', 0, 'd'); "
               "insert into users values (10, 'dup@x'), (11, 'ok@x'); commit")
    until_caught_up("run", ra)
    ab = b.apply_config(a)
    origin = a.origin_name

    # T1: the table is missing; what came before is applied
    line = refusal(apply_run(ab))
    assert "public.items" in line and "does not exist" in line, line
    before = origin_state(b.dsn, origin)
    assert table_rows(b.dsn, "t")[0][:2] == (1, "before")
    sql(b.dsn, "create table items (id int primary key, v text)")

    # T2: a value of the wrong type
    line = refusal(apply_run(ab))
    assert "nums" in line and "abc" in line, line
    after_t1 = origin_state(b.dsn, origin)
    assert after_t1[0] != before[0]  # T1 went in …
    assert refusal(apply_run(ab)) == line  # … and T2 fails again, the same way
    assert origin_state(b.dsn, origin) == after_t1
    sql(b.dsn, "alter table nums alter column n type text")

    # T3: a unique clash (conflict = "error")
    line = refusal(apply_run(ab))
    assert "users" in line and "10" in line, line
    after_t2 = origin_state(b.dsn, origin)
    assert after_t2[0] != after_t1[0]
    assert refusal(apply_run(ab)) == line
    assert origin_state(b.dsn, origin) == after_t2
    assert table_rows(b.dsn, "users") == [(1, "dup@x")]  # nothing of T3
    sql(b.dsn, "delete from users where id = 1")

    done = apply_run(ab)
    assert done.returncode == 0, done.stderr[-3000:]
    assert stats(done.stderr)["transactions"] == 1
    for table in ("t", "items", "nums", "users"):
        assert table_rows(b.dsn, table) == table_rows(a.dsn, table), table


def test_commit_time_failure_leaves_the_origin(node_db, kafka_bootstrap, tmp_path):
    """A deferred constraint on the target fails at COMMIT: the origin stays."""
    a, b, ra = two_nodes(node_db, tmp_path, kafka_bootstrap)
    sql(b.dsn, "create table users (id int primary key, email text unique deferrable "
               "initially deferred); insert into users values (1, 'dup@x')")
    sql(a.dsn, "insert into users values (5, 'five@x')")
    sql(a.dsn, "insert into users values (10, 'dup@x'), (11, 'ok@x')")
    until_caught_up("run", ra)
    ab = b.apply_config(a)
    line = refusal(apply_run(ab))
    assert "users" in line, line
    state = origin_state(b.dsn, a.origin_name)
    assert table_rows(b.dsn, "users") == [(1, "dup@x"), (5, "five@x")]
    assert refusal(apply_run(ab)) == line
    assert origin_state(b.dsn, a.origin_name) == state
    sql(b.dsn, "delete from users where id = 1")
    done = apply_run(ab)
    assert done.returncode == 0, done.stderr[-3000:]
    assert table_rows(b.dsn, "users") == table_rows(a.dsn, "users")


@pytest.mark.parametrize("policy", ["skip", "upsert", "error"])
def test_unique_clash_on_a_non_key_column(node_db, kafka_bootstrap, tmp_path, policy):
    a, b, ra = two_nodes(node_db, tmp_path, kafka_bootstrap)
    sql(b.dsn, "create table users (id int primary key, email text unique); "
               "insert into users values (1, 'dup@x')")
    # one transaction: a row that clashes on email, and one that clashes with nothing
    sql(a.dsn, "insert into users values (10, 'dup@x'), (11, 'ok@x')")
    sql(a.dsn, "update users set email = 'dup@x' where id = 11")  # clashes with row 1
    sql(a.dsn, "insert into users values (13, 'z@x')")
    until_caught_up("run", ra)
    ab = b.apply_config(a, policy)
    if policy == "error":
        line = refusal(apply_run(ab))
        assert "users" in line and "'id': 10" in line and "email" in line, line
        assert table_rows(b.dsn, "users") == [(1, "dup@x")]  # not even row 11
        state = origin_state(b.dsn, a.origin_name)
        assert state == (None, []) or state[0] == "0/0", state
        assert refusal(apply_run(ab)) == line
        assert origin_state(b.dsn, a.origin_name) == state
        return
    done = apply_run(ab)
    assert done.returncode == 0, done.stderr[-3000:]
    s = stats(done.stderr)
    assert s["transactions"] == 3
    # row 10 and row 11's new email are the conflicts; row 11 and 13 are applied
    assert table_rows(b.dsn, "users") == [(1, "dup@x"), (11, "ok@x"), (13, "z@x")]
    assert s["conflicts_insert_exists"] == 1 and s["conflicts_update_exists"] == 1, s
    logged = [ln for ln in done.stderr.splitlines() if "conflict" in ln and "users" in ln]
    assert any("'id': 10" in ln for ln in logged) and any("'id': 11" in ln for ln in logged)
    again = apply_run(ab)  # the origin covers all three: nothing is applied twice
    assert again.returncode == 0 and stats(again.stderr)["transactions"] == 0


BREAKAGES = {
    "check": ("create table items (id int primary key, v text check (v <> 'xyz'))",
              "alter table items drop constraint items_v_check"),
    "not_null": ("create table items (id int primary key, v text not null default 'n')",
                 "alter table items alter column v drop not null"),
    "trigger": ("create table items (id int primary key, v text); create function no() "
                "returns trigger language plpgsql as $$ begin raise exception 'no items'; "
                "end $$; create trigger no before insert on items for each row execute "
                "function no()", "drop trigger no on items"),
    "column": ("create table items (id int primary key)",
               "alter table items add column v text"),
    "length": ("create table items (id int primary key, v varchar(2))",
               "alter table items alter column v type text"),
    "foreign_key": ("create table parent (id int primary key); create table items (id int "
                    "primary key references parent, v text)",
                    "insert into parent values (1)"),
    "deferred_fk": ("create table parent (id int primary key); create table items (id int "
                    "primary key references parent deferrable initially deferred, v text)",
                    "insert into parent values (1)"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_target_stops_without_moving_the_origin(node_db, kafka_bootstrap, tmp_path,
                                                         breakage):
    broken, fix = BREAKAGES[breakage]
    a, b, ra = two_nodes(node_db, tmp_path, kafka_bootstrap)
    sql(b.dsn, broken)
    sql(a.dsn, "insert into t values (1, 'before', 0, 'd')")
    value = "null" if breakage == "not_null" else "'xyz'"
    sql(a.dsn, f"begin; insert into t values (2, 'T', 0, 'd'); "
               f"insert into items values (1, {value}); commit")
    sql(a.dsn, "insert into t values (3, 'after', 0, 'd')")
    until_caught_up("run", ra)
    ab = b.apply_config(a)
    line = refusal(apply_run(ab))
    assert "items" in line, line
    state = origin_state(b.dsn, a.origin_name)
    assert [r[0] for r in table_rows(b.dsn, "t")] == [1]  # before it, not it
    assert refusal(apply_run(ab)) == line
    assert origin_state(b.dsn, a.origin_name) == state
    sql(b.dsn, fix)
    done = apply_run(ab)
    assert done.returncode == 0, done.stderr[-3000:]
    assert stats(done.stderr)["transactions"] == 2
    assert table_rows(b.dsn, "t") == table_rows(a.dsn, "t")
    assert table_rows(b.dsn, "items") == table_rows(a.dsn, "items")


def test_commit_failure_after_the_origin_setup_puts_the_origin_back(
        node_db, kafka_bootstrap, tmp_path):
    """A deferrable constraint made while the applier runs (it looked for them at start):
    COMMIT fails after the origin setup, and the applier puts the origin back."""
    import time

    a, b, ra = two_nodes(node_db, tmp_path, kafka_bootstrap)
    sql(b.dsn, "create table users (id int primary key, email text)")
    sql(a.dsn, "insert into users values (1, 'dup@x')")
    until_caught_up("run", ra)
    ab = b.apply_config(a)
    proc = subprocess.Popen([sys.executable, "-m", "actors.cli", "apply", "-c", str(ab)], cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while table_rows(b.dsn, "users") != [(1, "dup@x")]:
            assert proc.poll() is None and time.monotonic() < deadline, "first row not applied"
            time.sleep(0.2)
        state = origin_state(b.dsn, a.origin_name)
        sql(b.dsn, "alter table users add constraint one_email unique (email) deferrable "
                   "initially deferred")
        sql(a.dsn, "insert into users values (2, 'dup@x')")
        until_caught_up("run", ra)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err[-3000:]
    assert origin_state(b.dsn, a.origin_name) == state
    assert err.splitlines()[-1].startswith("pgrouter apply: committing transaction"), err[-3000:]
    assert "one_email" in err.splitlines()[-1]
    assert "replication origin put back after a failed commit" in err, err[-3000:]
    assert table_rows(b.dsn, "users") == [(1, "dup@x")]
    sql(b.dsn, "alter table users drop constraint one_email")
    done = apply_run(ab)
    assert done.returncode == 0, done.stderr[-3000:]
    assert table_rows(b.dsn, "users") == table_rows(a.dsn, "users")
