"""Shared fixtures.

Tests that need PostgreSQL or Kafka take the ``pg_dsn`` / ``kafka_bootstrap`` fixtures, which
bring up the project's dev stack (``pgrouter devstack up``) once per session. ``PGROUTER_TEST_DSN``
and ``PGROUTER_TEST_KAFKA`` point the tests at already running services instead. A service
that cannot be started is a test failure, never a skip.
"""

from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def devstack():
    from actors.devstack import ensure_up

    try:
        return ensure_up(ROOT / ".devstack")
    except Exception as exc:  # a missing service fails the run, it is never skipped
        pytest.fail(f"dev stack could not be started: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def pg_dsn(request) -> str:
    if os.environ.get("PGROUTER_TEST_DSN"):
        return os.environ["PGROUTER_TEST_DSN"]
    return request.getfixturevalue("devstack").pg_dsn


@pytest.fixture(scope="session")
def kafka_bootstrap(request) -> str:
    if os.environ.get("PGROUTER_TEST_KAFKA"):
        return os.environ["PGROUTER_TEST_KAFKA"]
    return request.getfixturevalue("devstack").kafka_bootstrap
