"""The built-in type names every record source uses (``router/postgres/type_names.py``) are the
server's own: every type with an OID below 10000, which pgoutput never describes with a Type
message, on every PostgreSQL version of the matrix."""

from __future__ import annotations

import pytest

from router.postgres.type_names import BUILTIN_TYPES
from tests.helpers import Pg

pytestmark = pytest.mark.services


@pytest.mark.pg_matrix
def test_builtin_type_names_are_the_servers(pg_dsn):
    pg = Pg(pg_dsn)
    try:
        server = {oid: name for oid, name in pg.run(
            "select oid::int, typname::text from pg_type where oid < 10000 order by oid")}
    finally:
        pg.close()
    assert server, "no built-in types read"
    assert {oid: BUILTIN_TYPES.get(oid) for oid in server} == server
