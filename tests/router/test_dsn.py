"""Both libpq DSN forms, as libpq reads them, turned into the URI asyncpg reads, and masked."""

from __future__ import annotations

import urllib.parse

import pytest

from router.postgres import dsn
from router.errors import ConfigError


@pytest.mark.parametrize("text, expected", [
    ("host=db port=5433 dbname=app user=u", {"host": "db", "port": "5433", "dbname": "app",
                                             "user": "u"}),
    ("host = db   dbname =app", {"host": "db", "dbname": "app"}),
    ("password='a b\\'c\\\\d' user=u", {"password": "a b'c\\d", "user": "u"}),
    ("password=a\\ b user=u", {"password": "a b", "user": "u"}),
    ("password='' user=u", {"password": "", "user": "u"}),
    ("", {}),
    ("postgresql://u:p%40ss@h:5433/my%20db?sslmode=require",
     {"user": "u", "password": "p@ss", "host": "h", "port": "5433", "dbname": "my db",
      "sslmode": "require"}),
    ("postgres://h1:1,[::1]:2/db", {"host": "h1,::1", "port": "1,2", "dbname": "db"}),
    ("postgresql:///db?host=/var/run/postgresql", {"dbname": "db",
                                                   "host": "/var/run/postgresql"}),
    ("postgresql://h/db?ssl=true", {"host": "h", "dbname": "db", "sslmode": "require"}),
])
def test_parse_follows_libpq(text, expected):
    assert dsn.parse(text) == expected


@pytest.mark.parametrize("text, message", [
    ("postgresql//h/db", 'missing "="'),
    ("dbname", 'missing "="'),
    ("host=h colour=blue", "unknown connection option 'colour'"),
    ("password='abc", "unterminated"),
    ("postgresql://h:xx/db", "invalid port"),
    ("postgresql://h/db?colour=blue", "unknown URI query parameter"),
    ("port=0", "invalid port"),
    ("hostaddr=10.0.0.1", "not supported"),
    ("channel_binding=require", "not supported"),
])
def test_what_libpq_or_asyncpg_cannot_use_is_a_config_error(text, message):
    with pytest.raises(ConfigError, match=message) as info:
        dsn.validate(text, path="target.dsn")
    assert info.value.path == "target.dsn"


def _query(uri: str) -> dict[str, str]:
    assert uri.startswith("postgresql://?")
    return dict(urllib.parse.parse_qsl(uri.split("?", 1)[1], strict_parsing=True))


def test_asyncpg_uri_carries_every_value_encoded():
    uri = dsn.asyncpg_uri("host=db port=5433 dbname='my db' user=u password='p&a=s s\\'+' "
                          "sslmode=verify-full connect_timeout=5 keepalives=1 "
                          "application_name=x options='-c search_path=s'")
    assert _query(uri) == {"host": "db", "port": "5433", "dbname": "my db", "user": "u",
                           "password": "p&a=s s'+", "sslmode": "verify-full",
                           "application_name": "x", "options": "-c search_path=s"}


def test_asyncpg_uri_brackets_ipv6_hosts():
    assert _query(dsn.asyncpg_uri("host=::1,db port=1,2"))["host"] == "[::1],db"
    assert _query(dsn.asyncpg_uri("postgresql://[::1]:5/d"))["host"] == "[::1]"


@pytest.mark.parametrize("text", [
    "host=h password=s3cret user=u",
    "host=h password = 's3 cret' user=u",
    "host=h password=s3\\ cret user=u",
    "postgresql://u:s3cret@h/db",
    "postgresql://u@h/db?password=s3cret&sslmode=require",
])
def test_mask_hides_every_password(text):
    masked = dsn.mask(text)
    assert "s3" not in masked and "cret" not in masked and "***" in masked
    assert "user" in masked or "u@" in masked or "u:" in masked


def test_describe_names_the_server_without_the_password():
    assert dsn.describe("host=h port=5 user=u password=x dbname=d") == "u@h:5/d"
