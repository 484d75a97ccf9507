"""High availability (``[ha]``, docs/ha.md): what a frozen leader may do once it wakes, and a
new leader that must stream although the frozen one's walsender hangs.

* Freeze/thaw: the leader is SIGSTOPped while it produces under a steady update load of a
  few hundred keys, a standby takes over and streams newer versions, the load stops, the
  new leader catches up, and only then is the old leader woken (SIGCONT): whatever its Kafka
  client still had queued must not land after the new leader's records. The topic is
  folded by offset by a plain confluent_kafka Consumer, ``read_uncommitted`` (what an
  at-least-once consumer does) and ``read_committed``: every key ends on PostgreSQL's
  version, and each key's versions go back at most once (the new leader sending again what
  the slot had not confirmed, identical, at the same positions).
* Freeze under load: the frozen leader's walsender blocks writing to its full socket, and
  ``pg_terminate_backend`` alone does not end it; the new leader must keep its lease and
  stream once the walsender is gone, never stop with "slot is in use".

``PGROUTER_HA_REPEAT`` runs each case that many times in a row (CI: 2, about 80 s in all).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import psycopg2
import pytest

from tests.e2e.guarantee import topic_size, wait_for
from tests.e2e.ha_routers import Group
from tests.e2e.test_exactly_once import read_committed
from tests.e2e.test_ha import slot_table  # noqa: F401  (the fixture)
from tests.helpers import read_topic

pytestmark = pytest.mark.services

REPEAT = int(os.environ.get("PGROUTER_HA_REPEAT", "2"))
KEYS = 300


class UpdateLoad(threading.Thread):
    """Updates the table's ``KEYS`` rows round and round, ``per_txn`` rows a transaction at
    about ``rate`` transactions a second: ``batch`` counts each row's versions."""

    def __init__(self, dsn: str, table: str, *, rate: float, per_txn: int, payload: int):
        super().__init__(daemon=True)
        self.dsn, self.table, self.rate, self.per_txn = dsn, table, rate, per_txn
        self.payload = payload
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.txns = 0

    def run(self):
        try:
            conn = psycopg2.connect(self.dsn)
            conn.autocommit = True
            first = 0
            while not self.halt.is_set():
                started = time.monotonic()
                with conn.cursor() as cur:
                    cur.execute(f"update {self.table} set batch = batch + 1, payload = "
                                f"repeat(md5(random()::text), %s) where id >= %s and id < %s",
                                (self.payload // 32, first, first + self.per_txn))
                self.txns += 1
                first = (first + self.per_txn) % KEYS
                time.sleep(max(0.0, 1 / self.rate - (time.monotonic() - started)))
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)
        assert self.error is None, f"load failed: {self.error!r}"


def _fold(records: list[tuple[int, bytes, bytes]]) -> tuple[dict, dict]:
    """Each key's version after applying the records in offset order, and how often its
    version went back."""
    last, back = {}, {}
    for _, key, value in records:
        if value is None:
            continue
        row = json.loads(value)["after"]
        k = json.loads(key)["id"]
        if k in last and row["batch"] < last[k]:
            back[k] = back.get(k, 0) + 1
        last[k] = row["batch"]
    return last, back


def _uncommitted(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes]]:
    return [(r["partition"], r["raw"][0], r["raw"][1])
            for r in read_topic(bootstrap, topic, decode=False, timeout=120)]


def _caught_up(pg, slot: str) -> None:
    wait_for(lambda: pg.one("select confirmed_flush_lsn >= pg_current_wal_lsn() from "
                            "pg_replication_slots where slot_name = %s", slot),
             timeout=90, what="the new leader to catch up")


def leader_under_load(group: Group, load: UpdateLoad, bootstrap: str,
                      name: str) -> tuple[int, int]:
    """Waits for a leader to stream, starts ``load`` and waits for 3000 records in the topic:
    (the leader's index, its walsender's pid)."""
    i = group.leader()
    old = wait_for(group.holder, timeout=60, what="the leader to stream")
    load.start()
    wait_for(lambda: topic_size(bootstrap, name) > 3000, timeout=60,
             what="records before the freeze")
    return i, old


def _freeze_thaw(group: Group, pg, name: str, bootstrap: str, load: UpdateLoad) -> None:
    i = group.leader()
    zombie = group.routers[i]
    old = group.holder()
    for r in group.routers:
        r.set_mark()
    zombie.signal(signal.SIGSTOP)
    try:
        group.taken_over(old, time.time(), timeout=60)
        before = topic_size(bootstrap, name)
        wait_for(lambda: topic_size(bootstrap, name) > before + 500, timeout=60,
                 what="newer records from the new leader")
        load.stop()
        _caught_up(pg, name)
    finally:
        zombie.signal(signal.SIGCONT)
    wait_for(lambda: "leadership lost" in zombie.text(since_mark=True), timeout=30,
             what="the old leader to say it lost leadership")
    time.sleep(3)  # what its Kafka client still held is sent (or refused) by now


@pytest.mark.parametrize("run", range(REPEAT))
def test_a_woken_leader_lands_nothing_after_the_new_leader(slot_table, pg_dsn,  # noqa: F811
                                                           kafka_bootstrap, tmp_path, run):
    pg, name, config = slot_table
    pg.run(f"insert into {name} select g, 0, '' from generate_series(0, {KEYS - 1}) g")
    group = Group(config(), tmp_path, pg_dsn, name, n=2)
    load = UpdateLoad(pg_dsn, name, rate=100, per_txn=30, payload=256)
    try:
        leader_under_load(group, load, kafka_bootstrap, name)
        _freeze_thaw(group, pg, name, kafka_bootstrap, load)
        group.stop()
    except BaseException:
        load.halt.set()
        group.kill_all()
        raise
    final = dict(pg.run(f"select id, batch from {name}"))
    uncommitted = _uncommitted(kafka_bootstrap, name)
    for isolation, records in (("read_uncommitted", uncommitted),
                               ("read_committed", read_committed(kafka_bootstrap, name))):
        last, back = _fold(records)
        stale = {k: (v, final[k]) for k, v in last.items() if v != final[k]}
        assert not stale, (f"{isolation}: {len(stale)} key(s) end on an older version than "
                           f"PostgreSQL's (folded, found) e.g. {list(stale.items())[:5]}")
        twice = {k: n for k, n in back.items() if n > 1}
        assert not twice, (f"{isolation}: {len(twice)} key(s) went back to older versions "
                           f"more than once (the old leader's records after the new "
                           f"leader's): {list(twice.items())[:5]}")
        assert set(last) == set(final)
        print(f"{isolation}: {len(records)} records, {len(back)} key(s) sent again once")
    # what the fence costs in offsets: a commit marker per partition per Kafka transaction
    markers = topic_size(kafka_bootstrap, name) - len(uncommitted)
    print(f"{load.txns} source transactions, {markers} offsets taken by transaction markers")


def _walsender(pg, pid: int) -> str:
    rows = pg.run("select state, wait_event_type, wait_event from pg_stat_activity "
                  "where pid = %s", pid)
    return "/".join(str(x) for x in rows[0]) if rows else "gone"


@pytest.mark.parametrize("run", range(REPEAT))
def test_a_new_leader_streams_although_the_frozen_walsender_hangs(slot_table, pg_dsn,  # noqa: F811
                                                                  kafka_bootstrap, tmp_path,
                                                                  run):
    pg, name, config = slot_table
    pg.run(f"insert into {name} select g, 0, '' from generate_series(0, {KEYS - 1}) g")
    group = Group(config(), tmp_path, pg_dsn, name, n=2)
    load = UpdateLoad(pg_dsn, name, rate=100, per_txn=30, payload=1024)
    try:
        i, old = leader_under_load(group, load, kafka_bootstrap, name)
        zombie = group.routers[i]
        new = group.routers[1 - i]
        new.set_mark()
        zombie.signal(signal.SIGSTOP)
        start = time.time()
        states = []
        while group.holder() in (old, None) and time.time() < start + 90:
            states.append(_walsender(pg, old))
            assert new.proc.poll() is None, f"the new leader exited:\n{new.text()[-3000:]}"
            time.sleep(0.5)
        print("walsender states:", sorted(set(states)))
        took = time.time() - start
        assert group.holder() not in (old, None), (
            f"nobody streams {took:.0f} s after the freeze; the old walsender: "
            f"{_walsender(pg, old)}\n{new.text(since_mark=True)[-3000:]}")
        before = topic_size(kafka_bootstrap, name)
        wait_for(lambda: topic_size(kafka_bootstrap, name) > before + 500, timeout=60,
                 what="records from the new leader")
        print(f"the new leader streams {took:.1f} s after the freeze")
        load.stop()
        zombie.signal(signal.SIGCONT)
        _caught_up(pg, name)
        group.stop()
    except BaseException:
        load.halt.set()
        group.kill_all()
        raise
