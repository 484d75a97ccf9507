"""The dev stack's choices: a port handed to a service that is not listening yet is never
handed out again (two extra PostgreSQL nodes once got the same port when the first port
after the main one was taken by another process), and a KRaft cluster id never starts with
'-' (the storage tool then read it as an option)."""

from __future__ import annotations

import socket

import pytest

from devstack import StackInfo, extra_nodes
from devstack.process import StackError, pick_port


def _listening():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def _free_run(n: int) -> int:
    """The first of ``n`` consecutive ports nobody uses."""
    for base in range(20000, 60000, 97):
        if all(pick_port("auto", p, what="t", flag="f") == p for p in range(base, base + n)):
            return base
    raise AssertionError("no free run of ports")


def test_auto_skips_taken_and_explicit_taken_is_refused():
    base = _free_run(3)
    assert pick_port("auto", base, what="t", flag="f", taken={base, base + 1}) == base + 2
    with pytest.raises(StackError):
        pick_port(base, base, what="t", flag="f", taken={base})


def test_extra_nodes_get_distinct_ports_when_the_next_port_is_busy():
    with _listening() as busy:
        port = busy.getsockname()[1]  # someone else listens right after "our" PostgreSQL
        info = StackInfo(pg_dsn=f"postgresql://postgres@127.0.0.1:{port - 1}/postgres",
                         kafka_bootstrap="127.0.0.1:1", pg_port=port - 1, kafka_port=1,
                         controller_port=2, state_dir="/nonexistent")
        extra = extra_nodes(info, 3)
    ports = [int(dsn.rsplit(":", 1)[1].split("/")[0]) for dsn in extra.values()]
    assert list(extra) == ["pg2", "pg3", "pg4"]
    assert len(set(ports)) == 3 and port not in ports and port - 1 not in ports


def test_kafka_cluster_ids_never_look_like_an_option():
    from devstack.kafka import cluster_id
    ids = [cluster_id() for _ in range(5000)]  # ~78 would start with '-' without the rule
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)
