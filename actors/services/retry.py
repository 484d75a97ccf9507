"""One retry loop for long-running commands (the router's supervisor, the applier).

Rules: a failure is retried when ``router.errors.is_retryable`` says so (one table keyed by
exception type), with exponential backoff from ``BACKOFF_MIN`` to ``BACKOFF_MAX`` seconds,
reset after a run that lasted a minute; every retry is logged at once ("restarting after
transient failure" with the error and the backoff); a stop request ends the wait at once.
With ``give_up_after`` (``--retry-timeout``), failures that go on for that many seconds
without a run lasting a minute in between end in ``GaveUp``. Anything not retryable is
raised as the router error that explains it; cancellation (a second signal) passes through;
an exception that is not a ``PgRouterError`` is a bug: its traceback is logged and it is
raised as ``InternalError``. Failures of a nursery arrive as exception groups: ``primary``
picks the cause.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

import trio

from router.errors import GaveUp, InternalError, PgRouterError, is_retryable

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


def only_cancelled(exc: BaseException) -> bool:
    """True when ``exc`` is a cancellation (or a group of nothing else)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


async def run_with_retries(run_once: Callable[[], Awaitable[None]], *, stop: trio.Event,
                           logger: logging.Logger,
                           on_restart: Callable[[str], None] | None = None,
                           give_up_after: float | None = None) -> int:
    """Run ``run_once`` until it returns, retrying transient failures. Returns the number of
    restarts; ``on_restart`` is told the error kind of each (for the metrics)."""
    backoff = BACKOFF_MIN
    restarts = 0
    failing_since: float | None = None
    while True:
        started = trio.current_time()
        try:
            await run_once()
            return restarts
        except BaseException as exc:  # noqa: BLE001 — classified right below
            if only_cancelled(exc):
                raise
            cause = primary(exc)
            if isinstance(cause, (KeyboardInterrupt, SystemExit)):
                raise
            if not isinstance(cause, PgRouterError):
                logger.error("unexpected failure", exc_info=exc)
                raise InternalError(f"unexpected failure (a bug in pgrouter; the traceback "
                                    f"is in the log above): {cause!r}") from cause
            if not is_retryable(cause) or stop.is_set():
                raise cause from None
            now = trio.current_time()
            if now - started > 60:
                backoff = BACKOFF_MIN
                failing_since = None
            if failing_since is None:
                failing_since = started
            if give_up_after is not None and now - failing_since >= give_up_after:
                raise GaveUp(f"gave up after {now - failing_since:.0f} s of transient failures "
                             f"(--retry-timeout {give_up_after:g}): {cause}") from cause
            if give_up_after is not None:
                backoff = min(backoff, max(0.1, give_up_after - (now - failing_since)))
            restarts += 1
            if on_restart is not None:
                on_restart(type(cause).__name__)
            log.event(logger, "restarting after transient failure", level=logging.WARNING,
                      error=str(cause),
                      kind=type(cause).__name__, backoff_s=round(backoff, 2),
                      restarts=restarts)
            with trio.move_on_after(backoff):
                await stop.wait()
            if stop.is_set():
                return restarts
            backoff = min(BACKOFF_MAX, backoff * 2)
