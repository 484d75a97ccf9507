"""A start of ``pgrouter run`` loads what its config uses: a router writing JSON with
librdkafka, on an initial snapshot of an empty table, never imports the schema registry's
HTTP client (``urllib.request`` and the HTTP and e-mail modules under it), kafka-python, the
applier, verify or the materializer. Each is a part of every start's time that the config
does not ask for. The modules are read from the real command's process at its exit."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.sources import new_table, run_probed, source_config, table_route
from tests.helpers import ROOT, drop_source

pytestmark = pytest.mark.services

#: prints the process's modules at exit, then runs ``pgrouter`` as ``python -m actors.cli``
PROBE = """
import atexit, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
sys.argv[0] = "pgrouter"
runpy.run_module("actors.cli", run_name="__main__")
"""
NOT_USED = ("urllib.request", "http.client", "email.parser", "kafka", "actors.apply",
            "actors.verify", "actors.materialize", "router.verify", "router.apply")


def test_a_json_router_on_librdkafka_imports_only_what_it_uses(pg_dsn, kafka_bootstrap,
                                                                 tmp_path):
    pg, name = new_table(pg_dsn, "imp", "id int primary key, v text")
    pg.run(f"create publication {name} for table {name}")
    cfg = source_config(tmp_path / "router.toml", pg_dsn, kafka_bootstrap, name,
                        kafka_extra='client = "librdkafka"',
                        extra='[snapshot]\nmode = "initial"\n',
                        routes=table_route(name, f"{name}.{{schema}}.{{table}}"))
    modules = tmp_path / "modules.txt"
    try:
        run_probed(PROBE, modules, cfg)
        loaded = set(modules.read_text().split())
        assert "confluent_kafka" in loaded and "actors.runner.supervisor" in loaded
        assert sorted(m for m in loaded if m in NOT_USED or m.startswith(
            tuple(f"{n}." for n in NOT_USED))) == []
    finally:
        drop_source(pg, name, kafka_bootstrap, (f"{name}.public.{name}",))


def test_the_applier_loads_prometheus_only_for_its_endpoint():
    """``pgrouter apply`` without ``[metrics] listen``: its modules load neither
    prometheus_client (with the HTTP server and e-mail modules under it) nor the registry's
    HTTP client."""
    probe = ("import sys, actors.cli.apply, actors.apply.applier; "
             "print(' '.join(m for m in ('prometheus_client', 'urllib.request', 'http.server') "
             "if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == []
