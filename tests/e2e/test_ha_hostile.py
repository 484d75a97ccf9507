"""High availability (``[ha]``) under a hostile operator: a leader frozen (SIGSTOP) in the
middle of its initial snapshot, a new leader killed right after it took over, ``[kafka]
exactly_once`` together with ``[ha]``. The topic is folded by offset by a plain
confluent_kafka Consumer (``read_uncommitted`` and ``read_committed``) and compared with
PostgreSQL's own SELECT; a woken former leader says one line, never librdkafka's own."""

from __future__ import annotations

import contextlib
import signal
import time

import pytest

from tests.e2e.guarantee import topic_size, wait_for
from tests.e2e.ha_routers import Group
from tests.e2e.test_exactly_once import read_committed
from tests.e2e.test_ha import slot_table  # noqa: F401  (the fixture)
from tests.e2e.test_ha_fencing import (KEYS, UpdateLoad, _caught_up, _fold, _freeze_thaw,
                                       _uncommitted, leader_under_load)

pytestmark = pytest.mark.services

RAW = ("TXNERR", "FATAL [rdkafka", "Traceback", "run one router per transactional id")


def _check(pg, name: str, bootstrap: str) -> None:
    final = dict(pg.run(f"select id, batch from {name}"))
    for isolation, records in (("read_uncommitted", _uncommitted(bootstrap, name)),
                               ("read_committed", read_committed(bootstrap, name))):
        last, back = _fold(records)
        stale = {k: (v, final[k]) for k, v in last.items() if v != final[k]}
        assert not stale, f"{isolation}: {len(stale)} stale key(s), e.g. {list(stale.items())[:5]}"
        assert set(last) == set(final), f"{isolation}: {len(set(final) - set(last))} key(s) missing"
        twice = {k: n for k, n in back.items() if n > 1}
        assert not twice, f"{isolation}: keys went back more than once: {list(twice.items())[:5]}"


def _quiet(router) -> None:
    text = router.text()
    found = [line for line in text.splitlines() if any(r in line for r in RAW)]
    assert not found, f"{router.log.name} printed:\n" + "\n".join(found[:5])


@contextlib.contextmanager
def _judged(group: Group, pg, name: str, bootstrap: str, load: UpdateLoad | None = None):
    """Around a test's faults: the group stopped after them (killed, the load halted, at an
    error), then no router printed a raw error and the topic folds to PostgreSQL's rows."""
    try:
        yield
        group.stop()
    except BaseException:
        if load is not None:
            load.halt.set()
        group.kill_all()
        raise
    for r in group.routers:
        _quiet(r)
    _check(pg, name, bootstrap)


def test_a_leader_frozen_in_its_initial_snapshot(slot_table, pg_dsn,  # noqa: F811
                                                 kafka_bootstrap, tmp_path):
    pg, name, config = slot_table
    rows = 60000
    pg.run(f"insert into {name} select g, 0, repeat('x', 200) from generate_series(0, {rows - 1}) g")
    group = Group(config(snapshot="initial"), tmp_path, pg_dsn, name, n=2)
    with _judged(group, pg, name, kafka_bootstrap):
        i = group.leader()
        zombie = group.routers[i]
        wait_for(lambda: topic_size(kafka_bootstrap, name) > 2000, timeout=60,
                 what="snapshot records before the freeze", interval=0.05)
        zombie.set_mark()
        zombie.signal(signal.SIGSTOP)
        try:
            wait_for(lambda: group.holder() not in (None,) and
                     group.routers[1 - i].get("/readyz")[0] == 200, timeout=90,
                     what="the standby to lead and stream")
            pg.run(f"update {name} set batch = batch + 1 where id < {KEYS}")
            _caught_up(pg, name)
        finally:
            zombie.signal(signal.SIGCONT)
        time.sleep(4)  # what its client still held is refused by now


@pytest.mark.parametrize("fault", ["kill9", "kill9-standby-frozen", "sigstop"])
def test_the_new_leader_killed_right_after_it_took_over(slot_table, pg_dsn,  # noqa: F811
                                                        kafka_bootstrap, tmp_path, fault):
    """kill -9, or a freeze in the middle of its takeover (still fencing the first frozen
    leader's walsender), of the router that just took over: a third one leads — the standby,
    or after kill -9 the router started in the killed one's place (it has the killed one's
    index in ``group.routers``: routers are told apart by object, not index; by index the
    replacement winning the group's assignment read as "no third leader" for 90 s).
    ``kill9-standby-frozen``: the standby frozen too, so the replacement must lead."""
    pg, name, config = slot_table
    pg.run(f"insert into {name} select g, 0, '' from generate_series(0, {KEYS - 1}) g")
    group = Group(config(), tmp_path, pg_dsn, name, n=3)
    load = UpdateLoad(pg_dsn, name, rate=100, per_txn=30, payload=256)
    with _judged(group, pg, name, kafka_bootstrap, load):
        i, old = leader_under_load(group, load, kafka_bootstrap, name)
        zombie, j, standby = group.routers[i], None, None
        zombie.signal(signal.SIGSTOP)
        try:
            group.taken_over(old, time.time(), timeout=60)
            j = group.leader()
            second = group.routers[j]
            if fault.startswith("kill9"):  # the new leader dies at once
                if fault == "kill9-standby-frozen":
                    standby = group.routers[3 - i - j]
                    standby.signal(signal.SIGSTOP)
                group.kill9(j)
                group.replace(j)
            else:
                second.signal(signal.SIGSTOP)
            wait_for(lambda: group.routers[group.leader()] not in (zombie, second),
                     timeout=90, what="a third leader")
            load.stop()
            _caught_up(pg, name)
        finally:
            zombie.signal(signal.SIGCONT)
            if standby is not None:
                standby.signal(signal.SIGCONT)
            if j is not None and group.routers[j].proc.poll() is None:
                group.routers[j].signal(signal.SIGCONT)
        time.sleep(4)


def test_exactly_once_with_ha_freeze_thaw(slot_table, pg_dsn, kafka_bootstrap,  # noqa: F811
                                          tmp_path):
    pg, name, config = slot_table
    pg.run(f"insert into {name} select g, 0, '' from generate_series(0, {KEYS - 1}) g")
    group = Group(config(kafka_extra=f'exactly_once = true\ncommitted_lsn_topic = "{name}.progress"\n'),
                  tmp_path, pg_dsn, name, n=2)
    load = UpdateLoad(pg_dsn, name, rate=100, per_txn=30, payload=256)
    with _judged(group, pg, name, kafka_bootstrap, load):
        leader_under_load(group, load, kafka_bootstrap, name)
        _freeze_thaw(group, pg, name, kafka_bootstrap, load)


def test_a_leader_fenced_by_a_router_of_another_group_says_so(slot_table, pg_dsn,  # noqa: F811
                                                              kafka_bootstrap, tmp_path):
    """Two ``[ha]`` groups on one slot (one router's ``[ha] group`` differs): each leads its
    own group, the second one's producer fences the first's in Kafka while the first still
    holds its lease. The first stops with one line about the groups, not exactly-once's
    "run one router per transactional id"."""
    from tests.e2e.ha_routers import Router

    pg, name, config = slot_table
    first = config()
    other = tmp_path / "other.toml"
    other.write_text(first.read_text().replace(
        "[ha]\nenabled = true\n", f'[ha]\nenabled = true\ngroup = "pgrouter.{name}.other"\n'))
    a = Router(first, tmp_path / "a.log")
    b = None
    try:
        wait_for(lambda: a.get("/readyz")[0] == 200, timeout=60, what="a to lead")
        b = Router(other, tmp_path / "b.log")
        wait_for(lambda: "Kafka transactions, so a new leader" in b.text(), timeout=60,
                 what="b to register the transactional id")
        deadline = time.time() + 30
        while a.proc.poll() is None and time.time() < deadline:
            pg.run(f"insert into {name} select coalesce(max(id), 0) + 1, 0, '' from {name}")
            time.sleep(0.2)
        assert a.proc.poll() is not None, f"a still runs:\n{a.text()[-2000:]}"
    finally:
        for r in (a, b):
            if r is not None and r.proc.poll() is None:
                r.signal(signal.SIGKILL)
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        for done in admin.delete_consumer_groups([f"pgrouter.{name}.other"],
                                                 request_timeout=10).values():
            try:
                done.result(15)
            except Exception:  # a killed member's session still open: Kafka drops it
                pass
    _quiet(a)
    last = a.text().strip().splitlines()[-1]
    assert "[ha] group" in last and "pgrouter." + name in last, last
