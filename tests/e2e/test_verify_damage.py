"""``pgrouter verify`` against topics damaged beyond repair by key, and ``--repair`` across a
router killed mid-repair, on the real stack: a topic whose oldest records were deleted
(``delete_records``: its first offset is no longer 0) is compared as a consumer reading from
the start reads it (its lost rows missing, exit 1); a deleted topic and a topic holding a
record no pgrouter wrote are one line each (exit 2); a repair is done when the router is
killed (``kill -9``, stopped first) right after verify asked for it and started again, and verify's metrics are scraped from
its endpoint while it waits for the repair.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.e2e.guarantee import delete_topics
from tests.e2e.verify_stack import Router, rewrite_topic, verify, wait_for
from tests.helpers import ROOT, Pg, kill9, unique, write_config

pytestmark = pytest.mark.services

ROWS = 2000
ROUTES = ("trunc", "gone", "junk", "kill")


@pytest.fixture(scope="module")
def stack(pg_dsn, kafka_bootstrap, tmp_path_factory):
    pg = Pg(pg_dsn)
    u = unique("vd")
    tmp = tmp_path_factory.mktemp(u)
    table = f"t_{u}"
    pg.run(f"create table {table}(id int primary key, n int, v text)")
    pg.run(f"insert into {table} select g, g, 'v' || g from generate_series(1, {ROWS}) g")
    pg.run(f"create publication p_{u} for table {table}")
    routes = "".join(f'[[routes]]\nname = "{r}_{u}"\ntables = ["{table}"]\n\n' for r in ROUTES)
    slot = f"{u}_router"
    cfg = write_config(tmp / "router.toml", dsn=pg_dsn, slot=slot, publications=[f"p_{u}"],
                       bootstrap=kafka_bootstrap, routes=routes)
    topics = {r: f"{r}_{u}.public.{table}" for r in ROUTES}
    state = {"router": Router(cfg, tmp / "router.log")}
    try:
        wait_for("the slot", lambda: pg.run("select 1 from pg_replication_slots where "
                                            "slot_name = %s and active", slot),
                 state["router"].log)
        code, doc, err = verify(cfg)  # waits for the initial snapshot's records
        assert code == 0 and doc["equal"], err
        yield {"pg": pg, "u": u, "cfg": cfg, "state": state, "topics": topics, "tmp": tmp,
               "bootstrap": kafka_bootstrap}
    finally:
        state["router"].stop()
        pg.drop_slot(slot)
        pg.run(f"drop publication if exists p_{u}")
        pg.run(f"drop table if exists {table}")
        delete_topics(kafka_bootstrap, list(topics.values()))
        pg.close()


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert lines and "Traceback" not in err, err
    return lines[-1]


def test_truncated_deleted_and_foreign_topics_are_one_line(stack):
    from confluent_kafka import Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    u, topics, boot = stack["u"], stack["topics"], stack["bootstrap"]
    admin = AdminClient({"bootstrap.servers": boot})
    [done] = admin.delete_records([TopicPartition(topics["trunc"], 0, 10)]).values()
    assert done.result(30).low_watermark == 10
    # compared as a consumer reading from the start reads it: the rows it lacks are missing
    code, doc, err = verify(stack["cfg"], "--route", f"trunc_{u}")
    [r] = doc["results"]
    assert code == 1 and r["missing"] == 10 and r["extra"] == r["different"] == 0, (err, r)
    assert any("starts at offset 10" in n and "oldest records were deleted" in n
               for n in r["notes"]), r
    delete_topics(boot, [topics["gone"]])
    code, _, err = verify(stack["cfg"], "--route", f"gone_{u}")
    line = _one_line(err)
    assert code == 2 and topics["gone"] in line and "does not exist" in line, err
    producer = Producer({"bootstrap.servers": boot})
    producer.produce(topics["junk"], key=b"\xff not json",
                     value=b'{"op":"c","after":{"id":1},"source":{"commit_lsn":1}}')
    producer.flush(30)
    code, _, err = verify(stack["cfg"], "--route", f"junk_{u}")
    line = _one_line(err)
    assert code == 2 and topics["junk"] in line and "cannot be verified" in line \
        and "not json" in line, err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def test_repair_resumes_after_kill9_and_metrics_are_served_meanwhile(stack):
    u, topic, boot = stack["u"], stack["topics"]["kill"], stack["bootstrap"]
    state, cfg = stack["state"], stack["cfg"]
    # 300 keys left out of the topic: the repair has something to do
    rewrite_topic(boot, topic, lambda records: [r for r in records
                                                if int(r[1].split(b":")[1][:-1]) % 7 != 0])
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "actors.cli", "verify", "-c", str(cfg),
                             "--route", f"kill_{u}", "--repair", "--json", "--wait", "60",
                             "--metrics-listen", f"127.0.0.1:{port}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        err = []
        for line in proc.stderr:
            err.append(line)
            if line.startswith("DIFFERENT"):  # compared; the repair not asked for yet
                os.killpg(state["router"].proc.pid, signal.SIGSTOP)
            if "repair requested" in line:
                break
        assert any("repair requested" in line for line in err), "".join(err)
        kill9(state["router"].proc)  # stopped before it could read the request
        log = state["router"].log
        killed_at = len(log.read_text())
        metrics = _scrape(port)
        assert f'pgrouter_verify_missing_rows{{route="kill_{u}",topic="{topic}"}} 285.0' \
            in metrics, metrics
        assert "pgrouter_verify_repairs_pending 1.0" in metrics, metrics
        assert "pgrouter_verify_running 1.0" in metrics, metrics
        state["router"] = Router(cfg, stack["tmp"] / "router.log")
        out, rest = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(err) + rest
    assert proc.returncode == 0, err
    assert '"equal":true' in out, out
    # the router started after the kill did the repair verify had asked for
    after = log.read_text()[killed_at:]
    assert "backfill requested" in after and "repair_keys" in after, after[-3000:]
    with pytest.raises(OSError):  # the endpoint is gone with verify
        _scrape(port)
