"""The dev stack's PostgreSQL versions: only 15–18 are offered, servers of other versions get
ports of their own, and an existing stack or data directory is never silently switched to
another major version."""

from __future__ import annotations

import msgspec
import pytest

from devstack import StackInfo, ensure_up, version_nodes
from devstack.distributions import VERSIONS, check_version
from devstack.postgres import Postgres
from devstack.process import StackError


def _info(**kw) -> StackInfo:
    base = dict(pg_dsn="postgresql://postgres@127.0.0.1:41000/postgres",
                kafka_bootstrap="127.0.0.1:41001", pg_port=41000, kafka_port=41001,
                controller_port=41002, state_dir="/nonexistent")
    return StackInfo(**{**base, **kw})


def test_only_the_supported_versions_are_offered():
    assert VERSIONS == (15, 16, 17, 18)
    with pytest.raises(StackError, match="PostgreSQL 14 is not available.*15, 16, 17, 18"):
        check_version(14)


def test_version_servers_get_distinct_ports_and_the_main_version_none():
    info = _info(pg_version=18, extra_pg={"pg2": "postgresql://postgres@127.0.0.1:41003/postgres"})
    got = version_nodes(info, [16, 18, 17, 16])
    assert sorted(got) == ["16", "17"]
    ports = {int(d.rsplit(":", 1)[1].split("/")[0]) for d in got.values()}
    assert len(ports) == 2 and not ports & {41000, 41001, 41002, 41003}
    # already known versions keep their server
    assert version_nodes(msgspec.structs.replace(info, version_pg=got), [16, 17]) == got


def test_dsn_for_a_version():
    info = _info(pg_version=15, version_pg={"18": "postgresql://postgres@127.0.0.1:5/postgres"})
    assert info.dsn_for(15) == info.pg_dsn
    assert info.dsn_for(18).endswith(":5/postgres")
    with pytest.raises(KeyError):
        info.dsn_for(16)


def test_a_stack_of_another_version_is_refused_before_anything_starts(tmp_path):
    (tmp_path / "state.json").write_bytes(msgspec.json.encode(_info(pg_version=15)))
    with pytest.raises(StackError, match="runs PostgreSQL 15, not 18"):
        ensure_up(tmp_path, pg_version=18)


def test_a_stack_recorded_before_versions_were_is_debians_15():
    old = b'{"pg_dsn":"x","kafka_bootstrap":"y","pg_port":1,"kafka_port":2,"controller_port":3}'
    assert msgspec.json.decode(old, type=StackInfo).pg_version == 15


def test_a_data_directory_of_another_version_is_refused(tmp_path):
    node = Postgres(tmp_path, 1, version=18)
    node.data.mkdir(parents=True)
    (node.data / "PG_VERSION").write_text("15\n")
    with pytest.raises(StackError, match="holds a PostgreSQL 15 cluster, not 18"):
        node.init(tmp_path / "no-bin")
