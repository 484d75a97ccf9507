"""Shared fixtures.

Tests that need PostgreSQL or Kafka take the ``pg_dsn`` / ``kafka_bootstrap`` fixtures, which
bring up the project's dev stack (``python -m devstack up``) once per session. ``PGROUTER_TEST_DSN``
and ``PGROUTER_TEST_KAFKA`` point the tests at already running services instead. A service
that cannot be started is a test failure, never a skip.

Tests that need a schema registry take ``registry_url``: the Confluent-compatible API
(``http://…/apis/ccompat/v7``) of the dev stack's Apicurio Registry, or of the registry
``PGROUTER_TEST_REGISTRY`` names.

The version matrix: a test marked ``pg_matrix`` runs once per PostgreSQL major version of
``MATRIX`` (ids ``[pg15]`` … ``[pg18]``). Its ``pg_dsn`` (and ``pg_nodes``) then point at a
server of that version: the main stack's server when it runs that version, else a server of
that version started beside it (``devstack up --with-pg-version N``) once per session.
``PGROUTER_TEST_VERSIONS=16,18`` narrows the matrix.

Two workers (``make test``: ``pytest -n 2 --dist loadgroup -m "not serial"``, then
``pytest -m serial``): a test file runs whole on one worker (its module fixtures once), the
Spark files all on one (one Spark session), and the tests in ``SERIAL`` run alone afterwards:
those that stop or restart a shared service, start servers of their own, or measure time or
memory that another test's load would distort.
"""

from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MATRIX = tuple(int(v) for v in os.environ.get("PGROUTER_TEST_VERSIONS", "15,16,17,18").split(","))


#: test files (or one test's node id) that run alone, after the others (see above); the Spark
#: cluster test starts a master, two workers and their executors beside the stack
SERIAL = (
    "tests/devstack/", "tests/integration/test_stack.py",
    "tests/e2e/test_faults.py", "tests/e2e/test_exactly_once.py::test_broker_restart",
    "tests/e2e/test_standby.py",
    "tests/e2e/test_kafka_cluster.py", "tests/e2e/test_demo.py", "tests/e2e/test_memory.py",
    "tests/e2e/test_metrics.py", "tests/e2e/test_console.py", "tests/e2e/test_console_apply.py",
    "tests/e2e/test_prometheus.py", "tests/e2e/test_avro_format.py",
    "tests/e2e/test_materialize_cluster.py",
    "tests/e2e/test_snapshot.py::test_sigterm_during_the_initial_snapshot",
    "tests/e2e/test_ha.py", "tests/e2e/test_ha_fencing.py",
    "tests/e2e/test_verify_damage.py::test_repair_resumes_after_kill9_and_metrics_are_served_meanwhile",
)


def pytest_configure(config):
    config.addinivalue_line("markers", "pg_matrix: runs against every PostgreSQL version of "
                            "the matrix (tests/conftest.py)")
    config.addinivalue_line("markers", "serial: runs alone, after the tests run by two workers "
                            "(tests/conftest.py SERIAL)")
    config.addinivalue_line("markers", "xdist_group: the tests one worker runs (pytest-xdist)")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
        group = "spark" if item.get_closest_marker("spark") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
    # the Spark files first: the longest group, handed to a worker while the other takes the
    # rest (workers take groups in this order)
    items.sort(key=lambda item: not item.get_closest_marker("spark"))


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("pg_matrix") and "pg_version" in metafunc.fixturenames:
        metafunc.parametrize("pg_version", MATRIX, indirect=True, scope="session",
                             ids=[f"pg{v}" for v in MATRIX])


@pytest.fixture(scope="session")
def devstack():
    from devstack import ensure_up

    try:
        return ensure_up(ROOT / ".devstack")
    except Exception as exc:  # a missing service fails the run, it is never skipped
        pytest.fail(f"dev stack could not be started: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def pg_version(request) -> int | None:
    """The major version a ``pg_matrix`` test runs against; None outside the matrix."""
    return getattr(request, "param", None)


def _server_version(dsn: str) -> int:
    import psycopg2

    with psycopg2.connect(dsn, connect_timeout=10) as conn, conn.cursor() as cur:
        cur.execute("select current_setting('server_version_num')::int / 10000")
        return cur.fetchone()[0]


def version_server(request, version: int) -> str:
    """The DSN of a server of ``version``: the main one when it runs that version, else one
    started beside the dev stack (a server that cannot be started fails the test)."""
    from devstack import ensure_up

    main = os.environ.get("PGROUTER_TEST_DSN")
    if main and _server_version(main) == version:
        return main
    if not main and request.getfixturevalue("devstack").pg_version == version:
        return request.getfixturevalue("devstack").pg_dsn
    try:
        return ensure_up(ROOT / ".devstack", versions=[version]).dsn_for(version)
    except Exception as exc:  # never a skip: a version that cannot run is a failure
        pytest.fail(f"PostgreSQL {version} could not be started: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def pg_dsn(request, pg_version) -> str:
    if pg_version is not None:
        return version_server(request, pg_version)
    if os.environ.get("PGROUTER_TEST_DSN"):
        return os.environ["PGROUTER_TEST_DSN"]
    return request.getfixturevalue("devstack").pg_dsn


@pytest.fixture(scope="session")
def kafka_bootstrap(request) -> str:
    if os.environ.get("PGROUTER_TEST_KAFKA"):
        bootstrap = os.environ["PGROUTER_TEST_KAFKA"]
    else:
        bootstrap = request.getfixturevalue("devstack").kafka_bootstrap
    _shared_state_topic(bootstrap)
    return bootstrap


def _shared_state_topic(bootstrap: str) -> None:
    """The default ``[snapshot] state_topic``, as on any cluster a router has run on. Without
    it a router that finds a slot made by hand (as many tests make theirs) and no state topic
    at all finishes an initial snapshot by backfilling every table (docs/snapshots.md): on a
    fresh cluster the first such tests would see that, later ones not. The tests of that
    behaviour use topics of their own."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = "pgrouter.snapshots"
    fut = admin.create_topics([NewTopic(name, 1, 1, config={"cleanup.policy": "compact"})])
    try:
        fut[name].result(30)
    except Exception as exc:  # already there: what every later session finds
        if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
            raise


@pytest.fixture(scope="session")
def registry_url(request) -> str:
    """The schema registry's Confluent-compatible API (a URL ending in ``/apis/ccompat/v7``)."""
    if os.environ.get("PGROUTER_TEST_REGISTRY"):
        return os.environ["PGROUTER_TEST_REGISTRY"]
    return request.getfixturevalue("devstack").registry_url


@pytest.fixture(autouse=True)
def _reap_routers():
    """A router the test started in the background and left running (it failed before its
    own kill) is killed when the test ends; a module's fixture started its router earlier
    and keeps it."""
    from tests.helpers import STARTED, reap_started

    since = len(STARTED)
    yield
    reap_started(since)
