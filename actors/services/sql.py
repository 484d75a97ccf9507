"""SQL on PostgreSQL (everything but the walsender stream): asyncpg under trio-asyncio.

The one module that speaks asyncio: callers stay in trio and must run inside
``trio_asyncio.open_loop()`` (the supervisor opens it). Connection failures become
``SourceUnavailable``; everything here is short catalog work.
"""

from __future__ import annotations

import asyncpg
import trio_asyncio

from router.errors import SourceUnavailable

_CONNECT_ERRORS = (OSError, asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError,
                   asyncpg.InterfaceError, TimeoutError)


class SqlSession:
    """A single asyncpg connection used from trio."""

    def __init__(self, conn: asyncpg.Connection):
        self._conn = conn

    @classmethod
    async def connect(cls, dsn: str, *, timeout: float = 10.0, utc: bool = True,
                      application_name: str = "pgrouter") -> "SqlSession":
        """``utc=False`` keeps the server's TimeZone (as the walsender session does: values
        read as text then print as the stream prints them)."""
        settings = {"application_name": application_name}
        if utc:
            settings["TimeZone"] = "UTC"
        try:
            conn = await trio_asyncio.aio_as_trio(asyncpg.connect)(
                dsn, timeout=timeout, server_settings=settings)
        except _CONNECT_ERRORS as exc:
            raise SourceUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
        return cls(conn)

    async def fetch(self, query: str, *args):
        try:
            return await trio_asyncio.aio_as_trio(self._conn.fetch)(query, *args)
        except _CONNECT_ERRORS as exc:
            raise SourceUnavailable(f"PostgreSQL connection lost: {exc}") from exc

    async def fetchval(self, query: str, *args):
        try:
            return await trio_asyncio.aio_as_trio(self._conn.fetchval)(query, *args)
        except _CONNECT_ERRORS as exc:
            raise SourceUnavailable(f"PostgreSQL connection lost: {exc}") from exc

    async def execute(self, query: str, *args):
        try:
            return await trio_asyncio.aio_as_trio(self._conn.execute)(query, *args)
        except _CONNECT_ERRORS as exc:
            raise SourceUnavailable(f"PostgreSQL connection lost: {exc}") from exc

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
