"""The router's checks of the server it (re)connects to, on real servers:

* ``source.failover = true`` needs PostgreSQL 17+ (one line naming the version otherwise);
  on 17+ the slot is created with ``failover = true``, and an existing slot without it is
  refused;
* after a reconnection, a server without the slot, or whose WAL ends before what the router
  already confirmed, is refused (``SlotMissing``, ``SlotBehind``: not retried).
"""

from __future__ import annotations

import pytest
import trio_asyncio

from actors.services import failover, slots
from actors.services.sql import SqlSession
from router.config.router import SourceConfig
from router.errors import ConfigError, SlotBehind, SlotMissing, is_retryable
from router.postgres.lsn import parse_lsn
from tests.helpers import Pg, unique

pytestmark = pytest.mark.services


def _src(dsn: str, slot: str, **kw) -> SourceConfig:
    return SourceConfig(dsn=dsn, slot=slot, publications=["p"], **kw)


@pytest.mark.pg_matrix
async def test_failover_slots_need_17_and_are_created_with_failover(pg_dsn, pg_version):
    pg = Pg(pg_dsn)
    slot = unique("fs")
    try:
        async with trio_asyncio.open_loop():
            async with await SqlSession.connect(pg_dsn) as sql:
                src = _src(pg_dsn, slot, failover=True)
                version = int(await sql.fetchval("select current_setting('server_version_num')"))
                if pg_version < 17:
                    with pytest.raises(ConfigError, match=f"PostgreSQL {pg_version} has no "
                                       "failover slots.*PostgreSQL 17 or later"):
                        await failover.check_server(sql, src, version)
                    return
                assert await failover.check_server(sql, src, version) is False  # a primary
                await slots.create(sql, slot, src.two_phase, src.failover)
                assert pg.one("select failover from pg_replication_slots where slot_name = %s",
                              slot) is True
                await failover.check_slot(sql, slot, src.failover)
                plain = unique("nf")
                await slots.create(sql, plain, False)
                try:
                    with pytest.raises(ConfigError, match="created without failover"):
                        await failover.check_slot(sql, plain, True)
                finally:
                    pg.drop_slot(plain)
    finally:
        pg.drop_slot(slot)
        pg.close()


async def test_a_server_without_the_slot_or_behind_the_confirmed_position_is_refused(pg_dsn):
    pg = Pg(pg_dsn)
    slot = unique("rs")
    pg.run("select pg_create_logical_replication_slot(%s, 'pgoutput')", slot)
    try:
        async with trio_asyncio.open_loop():
            async with await SqlSession.connect(pg_dsn) as sql:
                end = parse_lsn(await sql.fetchval(failover.WAL_END))
                await failover.check_resume(sql, slot, None)  # first connection
                await failover.check_resume(sql, slot, end)  # the same server, resumed
                with pytest.raises(SlotBehind, match="has WAL only up to .* but the router "
                                   "already confirmed") as behind:
                    await failover.check_resume(sql, slot, end + (64 << 20))
                with pytest.raises(SlotMissing, match="is missing on .*will not create") as gone:
                    await failover.check_resume(sql, unique("gone"), end)
        assert not is_retryable(behind.value) and not is_retryable(gone.value)
    finally:
        pg.drop_slot(slot)
        pg.close()


def test_check_names_what_the_server_version_lacks(request, kafka_bootstrap, tmp_path):
    """``pgrouter check`` reports source.failover on PostgreSQL 16 in one line."""
    import subprocess
    import sys

    from tests.conftest import ROOT, version_server
    from tests.helpers import write_config

    dsn = version_server(request, 16)
    cfg = write_config(tmp_path / "r.toml", dsn=dsn, slot=unique("ck"), publications=["p"],
                       bootstrap=kafka_bootstrap, source_extra="failover = true",
                       routes='[[routes]]\nname = "r"\ntables = ["public.t"]\n')
    proc = subprocess.run([sys.executable, "-m", "actors.cli", "check", "-c", str(cfg)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert ("source.failover: PostgreSQL 16 has no failover slots (synchronised to a standby); "
            "it needs PostgreSQL 17 or later") in out, out
