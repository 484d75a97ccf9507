"""Standbys and failover on a real PostgreSQL 18 pair (``devstack up --standby`` in its own
folder, ``.devstack/standby``, rebuilt for every test because a failover ends the pair):

* a route read from a slot on the standby gives the same records, at the same positions, as
  the same route read from the primary;
* failover: a router streams a steady write load from the primary with a ``failover = true``
  slot and a two-host DSN (``target_session_attrs=read-write``); the primary gets
  ``kill -9``, the standby is promoted, the router goes on by itself; afterwards the folded
  topic equals the new primary's table, duplicates are only at already delivered positions,
  and the time from the kill to the first record written on the new primary is reported;
* without a synchronised slot the router refuses to continue on the promoted standby.
"""

from __future__ import annotations

import pathlib
import shutil
import threading
import time

import psycopg2
import pytest

import devstack
from devstack.process import pick_port
from tests.helpers import (Pg, fold_rows, kill9, read_topic, run_router, start_router, unique,
                           write_config)

pytestmark = pytest.mark.services

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAIR = ROOT / ".devstack" / "standby"
VERSION = 18
DEADLINE = 120


@pytest.fixture
def pair():
    """(primary DSN, standby DSN) of a fresh PostgreSQL 18 pair; torn down afterwards."""
    _destroy()
    try:
        # away from 5432 and up, where the other stacks on this machine come and go
        port = pick_port("auto", 5800, what="PostgreSQL", flag="--pg-port")
        info = devstack.ensure_up(PAIR, pg_version=VERSION, standby=True, kafka=False,
                                  pg_port=port)
    except Exception as exc:  # a pair that cannot be started fails, never skips
        pytest.fail(f"PostgreSQL {VERSION} primary + standby could not be started: {exc}",
                    pytrace=False)
    yield info.pg_dsn, info.standby_pg
    _destroy()


def _destroy() -> None:
    devstack.down(PAIR)
    for name in ("pg", "standby", "state.json"):
        path = PAIR / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _wait(cond, what: str, timeout: float = DEADLINE, every: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def _replayed(primary: Pg, standby: Pg) -> None:
    lsn = primary.one("select pg_current_wal_lsn()::text")
    _wait(lambda: standby.one("select pg_last_wal_replay_lsn() >= %s::pg_lsn", lsn),
          "the standby to replay the primary's WAL")


def _create_slot_on_standby(primary: Pg, standby_dsn: str, slot: str) -> None:
    """Creating a slot on a standby waits for a running-transactions record from the
    primary; ``pg_log_standby_snapshot()`` writes one now."""
    done = threading.Event()

    def nudge():
        while not done.wait(0.3):
            primary.run("select pg_log_standby_snapshot()")
    t = threading.Thread(target=nudge, daemon=True)
    t.start()
    try:
        standby = Pg(standby_dsn)
        standby.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", slot)
        standby.close()
    finally:
        done.set()
        t.join(timeout=5)


def _route(name: str, table: str) -> str:
    return f'[[routes]]\nname = "{name}"\ntables = ["public.{table}"]\ntopic = "{name}"\n'


def test_a_slot_on_the_standby_gives_the_same_topic_as_the_primary(pair, kafka_bootstrap,
                                                                   tmp_path):
    primary_dsn, standby_dsn = pair
    primary, standby = Pg(primary_dsn), Pg(standby_dsn)
    t = unique("sb")
    primary.run(f"create table {t} (id int primary key, v text, n int);"
                f"create publication {t} for table {t}")
    primary.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", f"{t}_p")
    _replayed(primary, standby)
    _create_slot_on_standby(primary, standby_dsn, f"{t}_s")
    primary.run(f"insert into {t} select g, 'v' || g, g from generate_series(1, 300) g")
    primary.run(f"update {t} set n = n * 10 where id % 3 = 0")
    primary.run(f"delete from {t} where id % 7 = 0")
    primary.run(f"begin; insert into {t} values (1000, 'x', 1); update {t} set v = 'y' "
                f"where id = 1000; commit")
    _replayed(primary, standby)
    for side, dsn in (("p", primary_dsn), ("s", standby_dsn)):
        cfg = write_config(tmp_path / f"{side}.toml", dsn=dsn, slot=f"{t}_{side}",
                           publications=[t], bootstrap=kafka_bootstrap,
                           routes=_route(f"{t}_{side}", t))
        run_router(cfg, timeout=90)

    def records(topic):
        return [(r["value"]["op"], r["value"]["before"], r["value"]["after"],
                 r["value"]["source"]["commit_lsn"], r["value"]["source"]["seq"])
                for r in read_topic(kafka_bootstrap, topic)]
    from_primary, from_standby = records(f"{t}_p"), records(f"{t}_s")
    assert len(from_primary) == 300 + 100 + 42 + 2
    assert from_standby == from_primary
    primary.close()
    standby.close()


def _writer(dsn: str, table: str, start: int, stop: threading.Event, out: list) -> None:
    """Small transactions as fast as they commit; ``out`` gets the ids committed. Stops at
    ``stop`` or at the first error (the primary died)."""
    try:
        conn = psycopg2.connect(dsn, connect_timeout=5)
        conn.autocommit = True
        cur = conn.cursor()
        i = start
        while not stop.is_set():
            cur.execute(f"insert into {table} values (%s, 'w', 0), (%s, 'w', 0)", (i, i + 1))
            cur.execute(f"update {table} set n = n + 1 where id = %s", (i,))
            out.extend((i, i + 1))
            i += 2
            time.sleep(0.005)
        conn.close()
    except psycopg2.Error:
        pass


def _synced(standby: Pg, slot: str) -> bool:
    rows = standby.run("select synced and not temporary and invalidation_reason is null "
                       "from pg_replication_slots where slot_name = %s", slot)
    return bool(rows and rows[0][0])


def _two_host_dsn(primary_dsn: str, standby_dsn: str) -> str:
    hosts = ",".join(d.split("@", 1)[1].split("/", 1)[0] for d in (primary_dsn, standby_dsn))
    return f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"


def _failover(primary: Pg) -> float:
    primary.close()
    devstack.stop_service(PAIR, "pg", crash=True)
    killed = time.monotonic()
    devstack.promote_standby(PAIR)
    return killed


def test_the_router_survives_a_failover_to_the_standby(pair, kafka_bootstrap, tmp_path):
    primary_dsn, standby_dsn = pair
    primary, standby = Pg(primary_dsn), Pg(standby_dsn)
    t = unique("fo")
    primary.run(f"create table {t} (id int primary key, v text, n int);"
                f"create publication {t} for table {t}")
    cfg = write_config(tmp_path / "r.toml", dsn=_two_host_dsn(primary_dsn, standby_dsn),
                       slot=t, publications=[t], bootstrap=kafka_bootstrap,
                       routes=_route(t, t), source_extra="failover = true")
    router = start_router(cfg, tmp_path / "router.log")
    stop, before = threading.Event(), []
    writer = threading.Thread(target=_writer, args=(primary_dsn, t, 1, stop, before))
    try:
        # the router creates the slot, with failover; the load starts once it exists
        _wait(lambda: primary.run("select failover from pg_replication_slots where "
                                  "slot_name = %s", t), "the router to create its slot")
        assert primary.one("select failover from pg_replication_slots where slot_name = %s", t)
        writer.start()
        _wait(lambda: _synced(standby, t), "the failover slot to be synchronised to the "
              "standby", every=1)
        _wait(lambda: len(before) > 400, "load on the primary")
        killed = _failover(primary)
        writer.join(timeout=30)
        after: list[int] = []
        new = threading.Thread(target=_writer, args=(standby_dsn, t, 1_000_000, stop, after))
        new.start()
        first_new = _wait(lambda: any(r["value"]["after"] and r["value"]["after"]["id"] >= 1_000_000
                                      for r in read_topic(kafka_bootstrap, t, missing_ok=True))
                          and time.monotonic(),
                          "a record written on the new primary", every=0.2)
        time.sleep(1)
        stop.set()
        new.join(timeout=30)
        assert router.poll() is None, (tmp_path / "router.log").read_text()[-4000:]
        expected = {(i,): (i, v, n) for i, v, n in standby.run(f"select id, v, n from {t}")}

        diff: dict = {}

        def folded():
            recs = read_topic(kafka_bootstrap, t)
            got = {k: (r["id"], r["v"], r["n"]) for k, r in fold_rows(recs, ["id"]).items()}
            diff.update(missing=sorted(set(expected) - set(got))[:10],
                        extra=sorted(set(got) - set(expected))[:10],
                        differ=[(expected[k], got[k]) for k in expected
                                if k in got and got[k] != expected[k]][:10])
            return recs if got == expected else None
        try:
            recs = _wait(folded, "the folded topic to equal the new primary's table", timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {diff}") from None
        positions: dict[tuple, bytes] = {}
        for r in recs:
            pos = (r["value"]["source"]["commit_lsn"], r["value"]["source"]["seq"])
            assert positions.setdefault(pos, r["raw"][1]) == r["raw"][1], (
                f"two different records at position {pos}")
        print(f"\nfailover: {len(before)} rows before the kill, {len(after)} after, "
              f"{len(recs) - len(positions)} duplicates at delivered positions, first record "
              f"from the new primary {first_new - killed:.1f}s after kill -9")
        assert after and len(positions) >= len(expected)
    finally:
        stop.set()
        kill9(router)
        standby.close()


def test_a_promoted_standby_without_the_slot_is_refused(pair, kafka_bootstrap, tmp_path):
    primary_dsn, standby_dsn = pair
    primary, standby = Pg(primary_dsn), Pg(standby_dsn)
    t = unique("nofo")
    primary.run(f"create table {t} (id int primary key, v text, n int);"
                f"create publication {t} for table {t}")
    # failover = false: the standby never gets a copy of the slot
    cfg = write_config(tmp_path / "r.toml", dsn=_two_host_dsn(primary_dsn, standby_dsn),
                       slot=t, publications=[t], bootstrap=kafka_bootstrap, routes=_route(t, t))
    router = start_router(cfg, tmp_path / "router.log")
    try:
        _wait(lambda: primary.run("select 1 from pg_replication_slots where slot_name = %s", t),
              "the router to create its slot")
        primary.run(f"insert into {t} values (1, 'a', 1)")
        _wait(lambda: read_topic(kafka_bootstrap, t, missing_ok=True, settle=0),
              "the first record")  # polled: a missing topic is not waited for
        _wait(lambda: primary.one("select confirmed_flush_lsn > '0/0' from pg_replication_slots "
                                  "where slot_name = %s", t), "the slot to be confirmed")
        time.sleep(1)  # one more status update
        _failover(primary)
        code = router.wait(timeout=DEADLINE)
        log = (tmp_path / "router.log").read_text()
        assert code != 0
        assert f"replication slot '{t}' is missing on" in log, log[-3000:]
        assert "Traceback" not in log
        assert not standby.run("select 1 from pg_replication_slots where slot_name = %s", t)
    finally:
        kill9(router)
        standby.close()
