"""SQL on PostgreSQL (everything but the walsender stream): asyncpg under trio-asyncio.

The one module that speaks asyncio: callers stay in trio and must run inside
``trio_asyncio.open_loop()`` (the supervisor opens it). Both DSN forms work (a libpq
``key=value`` string is turned into the URI asyncpg reads, ``router.postgres.dsn``). Failures are
classified by SQLSTATE, never by text: a refused or dropped connection is
``SourceUnavailable`` (retried); a refused login (class 28), a missing database (3D000) or a
missing privilege (42501) are permanent, and their message names the config key and the
server (``source.dsn: … at user@host:port/db``).
"""

from __future__ import annotations

import asyncpg
import trio_asyncio

from router.postgres import dsn as dsns
from router.errors import (AuthenticationFailed, DatabaseMissing, PgRouterError,
                           PrivilegeMissing, SourceError, SourceUnavailable)

_CONNECT_ERRORS = (OSError, asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError,
                   asyncpg.InterfaceError, TimeoutError)

#: SQLSTATE (or its two-character class) -> the router's error; the first match wins
_BY_SQLSTATE: tuple[tuple[str, type[SourceError]], ...] = (
    ("28", AuthenticationFailed), ("3D000", DatabaseMissing), ("42501", PrivilegeMissing),
    ("08", SourceUnavailable), ("57", SourceUnavailable), ("53", SourceUnavailable),
)


def source_error(exc: BaseException, what: str) -> PgRouterError:
    """An asyncpg failure → the router's tree, by SQLSTATE."""
    if isinstance(exc, PgRouterError):
        return exc
    code = getattr(exc, "sqlstate", None) or ""
    for prefix, kind in _BY_SQLSTATE:
        if code.startswith(prefix):
            return kind(f"{what}: {exc}")
    if isinstance(exc, _CONNECT_ERRORS) or not code:
        return SourceUnavailable(f"{what}: {exc}")
    return SourceError(f"{what}: {exc}")


class SqlSession:
    """A single asyncpg connection used from trio."""

    def __init__(self, conn: asyncpg.Connection):
        self._conn = conn

    @classmethod
    async def connect(cls, dsn: str, *, timeout: float = 10.0, utc: bool = True,
                      application_name: str = "pgrouter",
                      path: str = "source.dsn") -> "SqlSession":
        """``utc=False`` keeps the server's TimeZone (as the walsender session does: values
        read as text then print as the stream prints them). ``path`` is the config key of
        ``dsn``, named by the error of a failed connection."""
        uri = dsns.asyncpg_uri(dsn, path=path)
        settings = {"application_name": application_name}
        if utc:
            settings["TimeZone"] = "UTC"
        try:
            conn = await trio_asyncio.aio_as_trio(asyncpg.connect)(
                uri, timeout=timeout, server_settings=settings)
        except (asyncpg.PostgresError, *_CONNECT_ERRORS) as exc:
            raise source_error(exc, f"{path}: cannot connect to PostgreSQL at "
                                    f"{dsns.describe(dsn)}") from exc
        return cls(conn)

    async def _call(self, method, query: str, *args):
        # a server error of the statement itself stays asyncpg's (callers such as the
        # applier tell a unique violation from a missing table); a lost connection is ours
        try:
            return await trio_asyncio.aio_as_trio(method)(query, *args)
        except _CONNECT_ERRORS as exc:
            raise source_error(exc, "PostgreSQL connection lost") from exc

    async def fetch(self, query: str, *args):
        return await self._call(self._conn.fetch, query, *args)

    async def fetchval(self, query: str, *args):
        return await self._call(self._conn.fetchval, query, *args)

    async def execute(self, query: str, *args):
        return await self._call(self._conn.execute, query, *args)

    async def copy_out(self, query: str, *args, sink) -> None:
        """``COPY (query) TO STDOUT`` in text format (``query`` is the SELECT); ``sink(data)``, a trio async function,
        gets the bytes as they arrive (in pieces that may split a row)."""
        async def output(data: bytes) -> None:
            await trio_asyncio.trio_as_aio(sink)(data)
        try:
            await trio_asyncio.aio_as_trio(self._conn.copy_from_query)(query, *args,
                                                                      output=output)
        except _CONNECT_ERRORS as exc:
            raise SourceUnavailable(f"PostgreSQL connection lost: {exc}") from exc

    @property
    def in_transaction(self) -> bool:
        """The session is inside a transaction block (also a failed one): after an error,
        False means the statement that failed ended its transaction (a COMMIT)."""
        return self._conn.is_in_transaction()

    @property
    def server_version(self) -> int:
        v = self._conn.get_server_version()
        return v.major * 10000 + v.minor

    async def close(self) -> None:
        try:
            await trio_asyncio.aio_as_trio(self._conn.close)(timeout=5)
        except Exception:  # closing a broken connection: nothing to save
            self._conn.terminate()

    async def __aenter__(self) -> "SqlSession":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
