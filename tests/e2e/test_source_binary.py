"""``[source] binary = true``: ``check`` and ``run`` both refuse it with one line naming the
key, before touching the server (no slot is created)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT, Pg, unique, write_config

pytestmark = pytest.mark.services


@pytest.mark.parametrize("command", [["check"], ["run", "--until-caught-up"]])
def test_binary_mode_is_refused_by_check_and_run(command, pg_dsn, kafka_bootstrap, tmp_path):
    pg = Pg(pg_dsn)
    name = unique("bin")
    pg.run(f"create table {name} (id int primary key, ok bool)")
    pg.run(f"create publication {name} for table {name}")
    try:
        cfg = write_config(tmp_path / "router.toml", dsn=pg_dsn, slot=name, publications=[name],
                           bootstrap=kafka_bootstrap, source_extra="binary = true",
                           routes=f'[[routes]]\nname = "r"\ntables = ["public.{name}"]\n')
        proc = subprocess.run([sys.executable, "-m", "actors.cli", *command[:1], "-c", str(cfg),
                               *command[1:]], capture_output=True, text=True, timeout=120,
                              cwd=ROOT)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        assert len(lines) == 1 and "source.binary: binary = true is not supported" in lines[0]
        assert not pg.run("select 1 from pg_replication_slots where slot_name = %s", name)
    finally:
        pg.drop_slot(name)
        pg.run(f"drop publication {name}")
        pg.run(f"drop table {name}")
        pg.close()
