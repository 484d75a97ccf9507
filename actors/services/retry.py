"""One retry loop for long-running commands (the router's supervisor, the applier).

Rules: a failure is retried when ``router.errors.is_retryable`` says so (one table keyed by
exception type), with exponential backoff from ``BACKOFF_MIN`` to ``BACKOFF_MAX`` seconds,
reset after a run that lasted a minute; a stop request ends the wait at once. Anything not
retryable is raised as the router error that explains it; an exception that is not a
``PgRouterError`` is a bug: its traceback is logged and it is raised as ``InternalError``.
Failures of a nursery arrive as exception groups: ``primary`` picks the cause.
"""

from __future__ import annotations

import logging
import time
from typing import Awaitable, Callable

import trio

from router.errors import InternalError, PgRouterError, is_retryable

from . import log

BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0


def primary(exc: BaseException) -> BaseException:
    """The exception that explains a failed nursery: a non-retryable router error first,
    then any router error, then anything else (a closed channel is only the echo of another
    actor's failure)."""
    leaves: list[BaseException] = []

    def walk(e):
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        elif not isinstance(e, trio.Cancelled):
            leaves.append(e)
    walk(exc)
    ours = [e for e in leaves if isinstance(e, PgRouterError)]
    for e in ours:
        if not is_retryable(e):
            return e
    if ours:
        return ours[0]
    causes = [e for e in leaves
              if not isinstance(e, (trio.BrokenResourceError, trio.ClosedResourceError))]
    return (causes or leaves or [exc])[0]


def _cancelled(exc: BaseException) -> bool:
    """Nothing but trio cancellations (possibly grouped by nurseries)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


async def run_with_retries(run_once: Callable[[], Awaitable[None]], *, stop: trio.Event,
                           logger: logging.Logger,
                           on_restart: Callable[[str], None] | None = None) -> int:
    """Run ``run_once`` until it returns, retrying transient failures. Returns the number of
    restarts; ``on_restart`` is told the error kind of each (for the metrics)."""
    backoff = BACKOFF_MIN
    restarts = 0
    while True:
        started = time.monotonic()
        try:
            await run_once()
            return restarts
        except BaseException as exc:  # noqa: BLE001 — classified right below
            cause = primary(exc)
            if isinstance(cause, (KeyboardInterrupt, SystemExit)) or _cancelled(exc):
                raise  # an abort (second signal) cancels the run: not a failure
            if not isinstance(cause, PgRouterError):
                logger.error("unexpected failure", exc_info=exc)
                raise InternalError(f"unexpected failure (a bug in pgrouter; the traceback "
                                    f"is in the log above): {cause!r}") from cause
            if not is_retryable(cause) or stop.is_set():
                raise cause from None
            if time.monotonic() - started > 60:
                backoff = BACKOFF_MIN
            restarts += 1
            if on_restart is not None:
                on_restart(type(cause).__name__)
            log.event(logger, "restarting after transient failure", error=str(cause),
                      kind=type(cause).__name__, backoff_s=round(backoff, 2),
                      restarts=restarts)
            with trio.move_on_after(backoff):
                await stop.wait()
            if stop.is_set():
                return restarts
            backoff = min(BACKOFF_MAX, backoff * 2)
