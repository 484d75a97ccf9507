"""A real Prometheus (Debian's package, installed by ``make``) scrapes a streaming router and
answers PromQL for the slot's lag; the shipped scrape config and alert rules pass promtool."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request

import pytest

from tests.e2e.test_metrics import free_port, status_of, wait_for
from tests.helpers import ROOT, Pg, kill9, start_router, unique, write_config

pytestmark = pytest.mark.services


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (make installs Debian's prometheus package)"
    return path


def test_shipped_prometheus_files_are_valid():
    promtool = _tool("promtool")
    for args in (["check", "config", "configs/prometheus.yml"],
                 ["check", "rules", "configs/pgrouter-alerts.yml"]):
        proc = subprocess.run([promtool, *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def promql(port: int, query: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        body = json.loads(urllib.request.urlopen(url, timeout=5).read())
    except OSError:
        return []
    return body["data"]["result"] if body.get("status") == "success" else []


def test_prometheus_scrapes_the_slot_lag(pg_dsn, kafka_bootstrap, tmp_path):
    prometheus = _tool("prometheus")
    pg = Pg(pg_dsn)
    name = unique("prom")
    pg.run(f"create table {name} (id int primary key)")
    pg.run(f"create publication {name} for table {name}")
    router_port, prom_port = free_port(), free_port()
    cfg = write_config(tmp_path / "router.toml", dsn=pg_dsn, slot=name, publications=[name],
                       bootstrap=kafka_bootstrap,
                       routes=f'[[routes]]\nname = "{name}"\ntables = ["public.{name}"]',
                       extra=f'[metrics]\nlisten = "127.0.0.1:{router_port}"\n'
                             'sample_interval = 0.5\n')
    (tmp_path / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: pgrouter
    static_configs: [{{targets: ["127.0.0.1:{router_port}"]}}]
""")
    router = start_router(cfg, tmp_path / "router.log")
    prom = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=open(tmp_path / "prometheus.log", "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: status_of(router_port, "/readyz") == 200, "the router streaming", 90)
        pg.run(f"insert into {name} select generate_series(1, 100)")
        up = wait_for(lambda: promql(prom_port, 'up{job="pgrouter"} == 1'), "a scrape", 90)
        assert up[0]["metric"]["job"] == "pgrouter"
        lag = wait_for(lambda: promql(prom_port, "pgrouter_slot_lag_bytes"),
                       "the slot lag in Prometheus", 60)
        assert float(lag[0]["value"][1]) >= 0
        produced = wait_for(lambda: [r for r in promql(
            prom_port, f'sum(pgrouter_records_produced_total{{route="{name}"}})')
            if float(r["value"][1]) == 100], "100 records in Prometheus", 60)
        assert produced
    finally:
        prom.send_signal(signal.SIGTERM)
        router.send_signal(signal.SIGTERM)
        for p in (prom, router):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill9(p)
        pg.drop_slot(name)
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}")
        pg.close()
    assert router.returncode == 0, (tmp_path / "router.log").read_text()[-3000:]
