"""Fixtures for multi-node tests: the dev stack with two extra PostgreSQL instances
(``devstack up --extra-postgres 2``), and throw-away databases on them.

``pg_nodes`` maps node names (``pg``, ``pg2``, ``pg3``) to server DSNs. ``node_db`` creates a
fresh database on a node and, at the end of the test, drops the replication slots and origins
made in it (leftover slots retain WAL) and the database itself. ``spark`` is the one local
Spark session (Kafka + Delta jars) the materializer tests share. ``fault_stack`` is the dev
stack of the tests that stop and restart its broker or server (``.devstack/faults``).
"""

from __future__ import annotations

import pathlib
import uuid

import psycopg2
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def pg_nodes(request, pg_version) -> dict[str, str]:
    """In the version matrix (``pg_matrix``) on a version the main stack does not run, the
    three nodes are databases of one server of that version: every test makes its own
    databases and names its origins and slots uniquely, so they do not meet."""
    from devstack import ensure_up

    if pg_version is not None:
        dsn = request.getfixturevalue("pg_dsn")
        info = request.getfixturevalue("devstack")
        if dsn != info.pg_dsn:
            return {"pg": dsn, "pg2": dsn, "pg3": dsn}
    try:
        info = ensure_up(ROOT / ".devstack", extra_postgres=2)
    except Exception as exc:  # a missing service fails the run, it is never skipped
        pytest.fail(f"dev stack with extra PostgreSQL could not be started: {exc}",
                    pytrace=False)
    return {"pg": info.pg_dsn, **info.extra_pg}


def _with_db(server_dsn: str, db: str) -> str:
    base, _, _ = server_dsn.rpartition("/")
    return f"{base}/{db}"


def _admin(server_dsn: str, sql: str, *args) -> list:
    conn = psycopg2.connect(server_dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


@pytest.fixture
def node_db(pg_nodes):
    """``node_db(node, name) -> dsn`` of a new database; everything in it is cleaned up."""
    made: list[tuple[str, str]] = []
    origins: list[tuple[str, str]] = []

    def make(node: str, name: str = "") -> str:
        db = f"mm_{name}_{uuid.uuid4().hex[:8]}"
        _admin(pg_nodes[node], f'create database "{db}"')
        made.append((pg_nodes[node], db))
        return _with_db(pg_nodes[node], db)

    make.origins = origins  # tests register (server_dsn, origin) to drop
    make.nodes = pg_nodes
    yield make
    for server, origin in origins:
        try:
            _admin(server, "select pg_replication_origin_drop(%s) where exists (select 1 from "
                   "pg_replication_origin where roname = %s)", origin, origin)
        except psycopg2.Error:
            pass
    for server, db in made:
        _admin(server, "select pg_terminate_backend(active_pid) from pg_replication_slots "
               "where database = %s and active_pid is not null", db)
        for _ in range(50):
            try:
                _admin(server, "select pg_drop_replication_slot(slot_name) from "
                       "pg_replication_slots where database = %s", db)
                break
            except psycopg2.Error:  # a walsender still exiting
                import time

                time.sleep(0.2)
        _admin(server, f'drop database if exists "{db}" with (force)')


@pytest.fixture(scope="session")
def fault_stack():
    """(folder, StackInfo) of a dev stack of its own (no registry) under ``.devstack/faults``,
    whose broker and server the fault tests stop and restart without disturbing any other
    test. One for the session: test_faults and test_exactly_once's broker restart (both
    serial, one after the other) share it instead of starting one each (about 20 s); it
    fetches no jars of its own, it takes the main stack's cache (Kafka's jars: about 10 s
    of Maven on a fresh clone)."""
    from devstack import down, ensure_up

    root = ROOT / ".devstack" / "faults"
    root.mkdir(parents=True, exist_ok=True)
    cache = root / "cache"
    if not cache.exists() and not cache.is_symlink():  # a stack made before keeps its own
        (ROOT / ".devstack" / "cache").mkdir(parents=True, exist_ok=True)
        cache.symlink_to(ROOT / ".devstack" / "cache", target_is_directory=True)
    try:
        info = ensure_up(root, registry=False)
    except Exception as exc:  # a missing service fails the run, it is never skipped
        pytest.fail(f"fault-test stack could not be started: {exc}", pytrace=False)
    yield root, info
    down(root)


@pytest.fixture(scope="session")
def spark(kafka_bootstrap):
    """One local[2] Spark session with Kafka and Delta for every materializer test."""
    from actors.materialize.jars import spark_jars
    from actors.materialize import job

    cfg = job.JobConfig(bootstrap_servers=kafka_bootstrap, warehouse="-", checkpoint="-",
                        master="local[2]", spark_conf={"spark.sql.shuffle.partitions": "2"},
                        jars=spark_jars(ROOT / ".devstack"))
    session = job.build_session(cfg)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def browser():
    """A headless chromium per test module (tests/e2e/console_browser.py)."""
    from tests.e2e.console_browser import chromium

    driver = chromium()
    try:
        yield driver
    finally:
        driver.quit()
