"""The console of ``pgrouter apply`` in a real browser (tests/e2e/test_console.py has the
router's): what the page shows against what the target database holds."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devstack.configs import toml
from tests.e2e.console_browser import free_port, http, stop, wait_for, with_token
from tests.e2e.guarantee import delete_topics
from tests.helpers import ROOT, Pg, database_dsn, run_router, unique, write_config

pytestmark = pytest.mark.services


def test_the_applier_page(pg_dsn, kafka_bootstrap, browser, tmp_path):
    """``pgrouter apply`` serves the same page: applied and skipped transactions, conflicts
    by kind, the last applied commit and the origin's progress, as the target holds them."""
    n = unique("cap")
    pg = Pg(pg_dsn)
    target_db = f"{n}_tgt"
    pg.run(f"create table {n}_t (id int primary key, v text)")
    pg.run(f"create publication {n}_p for table {n}_t")
    pg.run(f'create database "{target_db}"')
    target = Pg(database_dsn(pg_dsn, target_db))
    target.run(f"create table {n}_t (id int primary key, v text)")
    target.run(f"insert into {n}_t values (2, 'the target''s own')")  # a conflict to come
    router = write_config(
        tmp_path / "router.toml", dsn=pg_dsn, slot=n, publications=[f"{n}_p"],
        bootstrap=kafka_bootstrap, kafka_extra=f'transactions_topic = "{n}.tx"',
        routes=f'[[routes]]\nname = "r"\ntables = ["public.{n}_t"]\n'
               f'topic = "{n}.{{schema}}.{{table}}"\n',
        extra='[snapshot]\nmode = "never"\n')
    port = free_port()
    apply_cfg = tmp_path / "apply.toml"
    apply_cfg.write_text(toml({
        "kafka": {"bootstrap_servers": kafka_bootstrap, "transactions_topic": f"{n}.tx",
                  "topics": [f"{n}.public.*"], "poll_timeout": 0.1},
        "target": {"dsn": database_dsn(pg_dsn, target_db), "origin": n, "conflict": "skip"},
        "metrics": {"listen": f"127.0.0.1:{port}"}}))
    proc = None
    try:
        run_router(router)  # makes the slot
        for first in (1, 2, 3):  # three transactions; the second's row exists on the target
            pg.run(f"insert into {n}_t values ({first}, 'v{first}')")
        run_router(router)
        proc = subprocess.Popen([sys.executable, "-m", "actors.cli", "apply", "-c",
                                 str(apply_cfg)], cwd=ROOT, start_new_session=True,
                                stdout=subprocess.DEVNULL,
                                stderr=open(tmp_path / "apply.log", "ab"))
        wait_for(lambda: http(f"http://127.0.0.1:{port}/healthz", None)[0] == 200,
                 "the applier's listener", 30)
        with_token(browser, None)
        browser.get(f"http://127.0.0.1:{port}/")
        view = wait_for(lambda: (v := browser.execute_script("""
            const t = (id) => document.getElementById(id);
            return {kind: document.body.dataset.kind,
                    applied: t('apply-transactions').dataset.value, conflicts: t('apply-conflicts').textContent,
                    last: t('apply-last-commit').textContent, origin: t('apply-origin').textContent,
                    slot_hidden: t('slot-card').hidden};""")) and v["applied"] == "3" and v,
            "three applied transactions on the page", 60)
        assert view["kind"] == "apply" and view["slot_hidden"]
        assert view["conflicts"] == "insert_exists: 1"
        assert view["last"] != "–" and view["origin"].startswith(f"{n} at ")
        progress = target.one("select remote_lsn::text from pg_replication_origin_status s "
                              "join pg_replication_origin o on o.roident = s.local_id "
                              "where o.roname = %s", n)
        assert view["origin"] == f"{n} at {progress}"
        assert target.run(f"select id, v from {n}_t order by id") == [
            (1, "v1"), (2, "the target's own"), (3, "v3")]
    finally:
        if proc is not None:
            stop(proc)
        target.close()
        pg.run(f'drop database if exists "{target_db}" with (force)')
        pg.run("select pg_replication_origin_drop(%s) where exists (select 1 from "
               "pg_replication_origin where roname = %s)", n, n)
        pg.drop_slot(n)
        pg.run(f"drop publication if exists {n}_p")
        pg.run(f"drop table if exists {n}_t")
        pg.close()
        delete_topics(kafka_bootstrap, [f"{n}.public.{n}_t", f"{n}.tx"])
