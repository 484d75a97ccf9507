"""``pgrouter run --until-caught-up`` with two-phase decoding and a prepared transaction left
open: the run delivers everything else, exits 0 with a line naming the held transaction (its
gid and prepare LSN), and confirms nothing past the prepare; after COMMIT PREPARED the next
run delivers the transaction."""

from __future__ import annotations

import re
import subprocess

import pytest

from router.postgres.lsn import parse_lsn
from tests.e2e.sources import drop_made, new_table, source_config, table_route
from tests.helpers import ROOT, Pg, read_topic, router_cmd, run_router

pytestmark = pytest.mark.services
TIMEOUT = 90


def confirmed(pg: Pg, slot: str) -> int:
    return parse_lsn(pg.one("select confirmed_flush_lsn::text from pg_replication_slots "
                            "where slot_name = %s", slot))


def current_lsn(pg: Pg) -> int:
    return parse_lsn(pg.one("select pg_current_wal_lsn()::text"))


def ids(bootstrap: str, topic: str) -> list[int]:
    return sorted(r["value"]["after"]["id"] for r in read_topic(bootstrap, topic))


def test_prepared_transaction_does_not_hang_until_caught_up(pg_dsn, kafka_bootstrap, tmp_path):
    pg, name = new_table(pg_dsn, "prep", "id int primary key, v text")
    gid = f"{name}_gid"
    topic = f"{name}.public.{name}"
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "router.toml", pg_dsn, kafka_bootstrap, name,
                        source_extra="two_phase = true",
                        routes=table_route(name, topic))
    try:
        run_router(cfg, timeout=TIMEOUT)  # creates the slot (with two-phase decoding)
        pg.run(f"insert into {name} values (1, 'before')")
        before_prepare = current_lsn(pg)
        pg.run(f"begin; insert into {name} values (2, 'prepared'); "
               f"prepare transaction '{gid}'")
        after_prepare = current_lsn(pg)
        pg.run(f"insert into {name} values (3, 'after')")

        proc = subprocess.run(router_cmd(cfg, "--until-caught-up"), capture_output=True,
                              text=True, timeout=TIMEOUT, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [ln for ln in proc.stderr.splitlines() if "prepared transaction" in ln]
        assert len(lines) == 1, proc.stderr[-3000:]
        line = lines[0]
        assert f"gid={gid}" in line and "COMMIT PREPARED" in line, line
        prepare_lsn = parse_lsn(re.search(r"prepare_lsn=(\S+)", line).group(1))
        assert before_prepare <= prepare_lsn <= after_prepare, line
        # everything else is in Kafka; the slot is not confirmed past the prepare
        assert ids(kafka_bootstrap, topic) == [1, 3]
        held_at = confirmed(pg, name)
        assert held_at < prepare_lsn
        assert parse_lsn(re.search(r"confirmed_lsn=(\S+)", line).group(1)) == held_at

        pg.run(f"commit prepared '{gid}'")
        proc = run_router(cfg, timeout=TIMEOUT)
        assert "prepared transaction" not in proc.stderr, proc.stderr[-3000:]
        assert "caught up" in proc.stderr
        got = ids(kafka_bootstrap, topic)
        assert set(got) == {1, 2, 3} and got.count(2) == 1, got  # 3 may come again
        assert confirmed(pg, name) > after_prepare
    finally:
        if pg.run("select 1 from pg_prepared_xacts where gid = %s", gid):
            pg.run(f"rollback prepared '{gid}'")
        drop_made(pg, name)
        _delete_topic(kafka_bootstrap, topic)


def _delete_topic(bootstrap: str, topic: str) -> None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="pgrouter-test")
    try:
        if topic in set(admin.list_topics()):
            admin.delete_topics([topic])
    finally:
        admin.close()
