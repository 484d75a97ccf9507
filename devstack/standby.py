"""A streaming standby of the dev stack's main PostgreSQL, for reading a slot on a standby
(16+) and for failover slots (17+).

Rules:

* Made once with ``pg_basebackup -X stream -R -C -S pgrouter_standby`` (a physical slot on
  the primary keeps the WAL the standby still needs); the client programs are the 18 wheel's,
  which speak to 16 and 17 too (Debian's for 15). It runs the primary's major version.
* The standby runs with ``hot_standby_feedback = on`` (the primary keeps the catalog rows a
  logical slot on the standby needs; without it such a slot is invalidated by a conflict).
* On 17+: ``sync_replication_slots = on`` on the standby (its slot sync worker copies the
  primary's ``failover = true`` slots), and ``synchronized_standby_slots = 'pgrouter_standby'``
  on the primary: a logical walsender of a failover slot never sends a change the standby
  has not flushed, so after a promotion the standby has everything a consumer saw.
* ``promote`` makes the standby a primary (``pg_ctl promote``); the old primary is then a
  stranger: the stack is rebuilt from scratch (``down`` and remove the folder) to pair again.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

from . import distributions
from .postgres import Postgres, _as_owner
from .process import StackError, run_sql

PHYSICAL_SLOT = "pgrouter_standby"
FAILOVER_MIN_MAJOR = 17


def client_bindir(version: int, cache: pathlib.Path) -> pathlib.Path:
    if version == distributions.DEBIAN_VERSION:
        return distributions.bindir(version, cache)
    return distributions.client_bindir(cache)


def make(primary: Postgres, standby: Postgres, cache: pathlib.Path) -> None:
    """Clone ``primary`` into ``standby``'s data directory and configure both sides (the
    standby is not started here)."""
    if standby.data_version() is not None:
        return
    standby._chown()
    tools = client_bindir(primary.version, cache)
    run_sql(primary.dsn, f"select pg_drop_replication_slot('{PHYSICAL_SLOT}') from "
                      f"pg_replication_slots where slot_name = '{PHYSICAL_SLOT}' and not active")
    proc = subprocess.run(_as_owner([
        str(tools / "pg_basebackup"), "-d",
        f"host=127.0.0.1 port={primary.port} user=postgres dbname=postgres "
        "application_name=pgrouter_standby",
        "-D", str(standby.data), "-X", "stream", "-R", "-C", "-S", PHYSICAL_SLOT,
        "-c", "fast"]), capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise StackError(f"pg_basebackup of {primary.dsn} failed:\n{proc.stderr[-1500:]}")
    settings = {"hot_standby": "on", "hot_standby_feedback": "on"}
    if primary.version >= FAILOVER_MIN_MAJOR:
        settings["sync_replication_slots"] = "on"
    with open(standby.data / "postgresql.auto.conf", "a") as fh:
        fh.write("".join(f"{k} = {v}\n" for k, v in settings.items()))
    if primary.version >= FAILOVER_MIN_MAJOR:
        run_sql(primary.dsn, f"alter system set synchronized_standby_slots = '{PHYSICAL_SLOT}'",
             "select pg_reload_conf()")


def promote(standby: Postgres, bindir: pathlib.Path) -> None:
    proc = subprocess.run(_as_owner([str(bindir / "pg_ctl"), "-D", str(standby.data), "-w",
                                     "-t", "60", "promote"]),
                          capture_output=True, text=True, timeout=90)
    if proc.returncode != 0:
        raise StackError(f"promoting {standby.data} failed:\n{proc.stdout}{proc.stderr}")


def kill(node: Postgres) -> None:
    """``kill -9`` of the postmaster (a crash, for failover tests); its backends notice and
    exit by themselves."""
    pid = node.pid()
    if pid is not None:
        os.kill(pid, 9)
