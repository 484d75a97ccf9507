"""The set-up end-to-end tests share: a new table under a unique name (its slot and its
publication take the same name), the router config of that slot and publication, a route of
one table, and their removal; a run of the real command under a probe."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from tests.helpers import ROOT, Pg, unique, write_config


def new_table(pg_dsn: str, prefix: str, columns: str) -> tuple[Pg, str]:
    """A connection and a unique name ``<prefix>_…`` with the table ``<name> (columns)``
    made; the caller adds what else it needs (rows, the publication)."""
    pg = Pg(pg_dsn)
    name = unique(prefix)
    pg.run(f"create table {name} ({columns})")
    return pg, name


def table_route(name: str, topic: str | None = None, *, table: str | None = None) -> str:
    """The ``[[routes]]`` table named ``name`` of ``public.<table>`` (default: the name) to
    ``topic`` (default: the name)."""
    return (f'[[routes]]\nname = "{name}"\ntables = ["public.{table or name}"]\n'
            f'topic = "{name if topic is None else topic}"\n')


def source_config(path: pathlib.Path, pg_dsn: str, kafka_bootstrap: str, name: str, *,
                  routes: str | None = None, **more: str) -> pathlib.Path:
    """``write_config`` with the slot and the publication ``name``; ``routes`` defaults to
    ``table_route(name)``; ``more``: write_config's other keys."""
    return write_config(path, dsn=pg_dsn, slot=name, publications=[name],
                        bootstrap=kafka_bootstrap,
                        routes=table_route(name) if routes is None else routes, **more)


def drop_made(pg: Pg, name: str, *, if_exists: bool = True) -> None:
    """What a test made, all named ``name``: its slot, publication and table; closes ``pg``."""
    pg.drop_slot(name)
    guard = "if exists " if if_exists else ""
    pg.run(f"drop publication {guard}{name}")
    pg.run(f"drop table {guard}{name}")
    pg.close()


def own_database(pg_dsn: str, prefix: str):
    """A fixture's body: a new database ``<prefix>_…`` on the server of ``pg_dsn``, yielded as
    ``(name, dsn)``; dropped after (with the inactive slots made in it)."""
    name = unique(prefix)
    admin = Pg(pg_dsn)
    admin.conn.autocommit = True
    admin.run(f"create database {name}")
    yield name, pg_dsn.rsplit("/", 1)[0] + "/" + name
    admin.run("select pg_drop_replication_slot(slot_name) from pg_replication_slots "
              "where database = %s and not active", name)
    admin.run(f"drop database {name} with (force)")
    admin.close()


def run_probed(probe: str, out: pathlib.Path, cfg: pathlib.Path) -> str:
    """``pgrouter run -c cfg --until-caught-up`` as ``python -c probe out …`` (a probe that
    records what the process did into ``out``, then runs ``actors.cli``): its stderr, after
    asserting it exited 0 and copied its initial snapshot."""
    proc = subprocess.run([sys.executable, "-c", probe, str(out), "run", "-c", str(cfg),
                           "--until-caught-up"], capture_output=True, text=True,
                          timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "initial snapshot: done" in proc.stderr, proc.stderr[-3000:]
    return proc.stderr
