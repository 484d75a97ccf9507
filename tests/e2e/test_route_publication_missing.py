"""A route naming a publication that does not exist is refused with one line naming the
route and the publication, by ``pgrouter check`` and ``pgrouter run`` alike (it used to end
in ``unexpected failure … KeyError`` with a traceback, from both), and no slot is created."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.e2e.sources import drop_made, source_config
from tests.helpers import ROOT, Pg, unique

pytestmark = pytest.mark.services


@pytest.mark.parametrize("command", [["check"], ["run", "--until-caught-up"]])
def test_a_route_on_a_missing_publication_is_one_line(pg_dsn, kafka_bootstrap, tmp_path,
                                                      command):
    name = unique("nopub")
    pg = Pg(pg_dsn)
    pg.run(f"create table {name} (a int primary key)")
    pg.run(f"create publication {name} for table {name}")
    try:
        cfg = source_config(tmp_path / "router.toml", pg_dsn, kafka_bootstrap, name,
                            routes=f'[[routes]]\nname = "r_{name}"\npublication = "{name}_nosuch"\n'
                                   f'topic = "{name}"\n')
        done = subprocess.run([sys.executable, "-m", "actors.cli", *command[:1], "-c", str(cfg),
                               *command[1:]], capture_output=True, text=True, timeout=120,
                              cwd=ROOT)
        out = done.stdout + done.stderr
        assert done.returncode != 0, out
        assert "Traceback" not in out and "unexpected failure" not in out, out
        final = [ln for ln in out.splitlines() if f"{name}_nosuch" in ln and "warning" not in ln]
        assert final, out
        assert f"r_{name}" in final[-1] or "routes[0]" in final[-1], out
        assert pg.one("select count(*) from pg_replication_slots where slot_name = %s",
                      name) == 0
    finally:
        drop_made(pg, name, if_exists=False)
