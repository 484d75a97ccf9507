"""Message routes on the real stack: a writer emits logical decoding messages in transactions
mixed with row changes (and some outside transactions); the router is killed with ``kill -9``
in the middle and started again. Folded by a plain confluent_kafka consumer: every message
is there, keyed by its JSON field, in commit order per key; duplicates only as
docs/delivery.md says — none for read_committed under exactly-once, identical ones at the
same position otherwise (and for non-transactional messages)."""

from __future__ import annotations

import json
import threading
import time

import psycopg2
import pytest

from tests.e2e.sources import drop_made, new_table, source_config
from tests.e2e.test_exactly_once import read_committed
from tests.helpers import kill9, run_router, start_router

pytestmark = pytest.mark.services

TXNS = 240
NT_EVERY = 20  # a non-transactional message every this many transactions


class Writer(threading.Thread):
    def __init__(self, dsn: str, name: str):
        super().__init__(daemon=True)
        self.dsn, self.name = dsn, name
        self.done = 0

    def run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        try:
            with conn.cursor() as cur:
                for i in range(TXNS):
                    cur.execute(f"insert into {self.name} values (%s)", (i,))
                    payload = json.dumps({"id": f"k{i % 7}", "n": i})
                    cur.execute("select pg_logical_emit_message(true, %s, %s)",
                                (f"{self.name}.o{i % 3}", payload))
                    cur.execute(f"update {self.name} set v = v + 1 where id = %s", (i,))
                    if i % NT_EVERY == 0:
                        cur.execute("select pg_logical_emit_message(false, %s, %s)",
                                    (f"{self.name}.nt", json.dumps({"id": "nt", "n": i})))
                    conn.commit()
                    self.done = i + 1
                    time.sleep(0.01)
        finally:
            conn.close()


@pytest.mark.parametrize("exactly_once", [False, True])
def test_messages_by_prefix_across_a_kill(pg_dsn, kafka_bootstrap, tmp_path, exactly_once):
    pg, name = new_table(pg_dsn, "mroute", "id int primary key, v int not null default 0")
    pg.run(f"create publication {name} for table {name}")
    routes = (f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]\n'
              f'[[message_routes]]\nname = "{name}_m"\nprefix = "{name}.*"\n'
              f'topic = "{{prefix}}.ev"\nkey = "id"\ntopic_settings = {{partitions = 3}}\n')
    cfg = source_config(tmp_path / "r.toml", pg_dsn, kafka_bootstrap, name, routes=routes,
                        kafka_extra=("exactly_once = true\ntransaction_interval_ms = 20\n"
                                     if exactly_once else ""))
    topics = [f"{name}.o{j}.ev" for j in range(3)] + [f"{name}.nt.ev"]
    log = tmp_path / "router.log"
    try:
        run_router(cfg)  # the slot
        router = start_router(cfg, log)
        writer = Writer(pg_dsn, name)
        writer.start()
        deadline = time.monotonic() + 60
        while writer.done < TXNS // 2:
            assert time.monotonic() < deadline and writer.is_alive(), "the writer is stuck"
            time.sleep(0.05)
        kill9(router)
        writer.join(timeout=60)
        assert writer.done == TXNS
        run_router(cfg)
        got = {t: [(p, k, json.loads(v)) for p, k, v in read_committed(kafka_bootstrap, t)]
               for t in topics}
        assert "Traceback" not in log.read_text()
    finally:
        drop_made(pg, name, if_exists=False)
    for j in range(3):
        events = got[f"{name}.o{j}.ev"]
        ns = [e["n"] for _, _, e in events]
        want = [i for i in range(TXNS) if i % 3 == j]
        assert sorted(set(ns)) == want, "a message is missing"
        if exactly_once:
            assert len(ns) == len(want), "read_committed sees a message twice"
        for p, key, e in events:  # keyed by the payload's field: one partition per key
            assert key == f"k{e['n'] % 7}".encode()
        by_key: dict = {}
        for p, key, e in events:
            by_key.setdefault(key, []).append((p, e["n"]))
        for key, seen in by_key.items():
            assert len({p for p, _ in seen}) == 1
            firsts = list(dict.fromkeys(n for _, n in seen))
            assert firsts == sorted(firsts), f"key {key} out of commit order"
    nt = [e["n"] for _, _, e in got[f"{name}.nt.ev"]]
    assert sorted(set(nt)) == list(range(0, TXNS, NT_EVERY))  # at least once
