"""The one retry loop: which failures it retries (``router.errors.RETRYABLE``), that it says
so at once, and that ``give_up_after`` bounds it. Virtual time (``autojump_clock``)."""

from __future__ import annotations

import logging

import pytest
import trio

from actors.services.retry import run_with_retries
from router.errors import (AuthenticationFailed, DatabaseMissing, GaveUp, PrivilegeMissing,
                           SinkUnavailable, SourceUnavailable)

_log = logging.getLogger("pgrouter.test")


def failing(exc_type, calls: list):
    async def run_once():
        calls.append(trio.current_time())
        raise exc_type("down")
    return run_once


@pytest.mark.parametrize("kind", [AuthenticationFailed, DatabaseMissing, PrivilegeMissing])
async def test_permanent_failures_are_raised_at_once(kind, autojump_clock):
    calls: list = []
    with pytest.raises(kind):
        await run_with_retries(failing(kind, calls), stop=trio.Event(), logger=_log)
    assert len(calls) == 1


@pytest.mark.parametrize("kind", [SourceUnavailable, SinkUnavailable])
async def test_transient_failures_are_retried_and_logged_then_given_up(kind, autojump_clock,
                                                                       caplog):
    calls: list = []
    caplog.set_level(logging.INFO, logger="pgrouter.test")
    with pytest.raises(GaveUp, match=r"--retry-timeout 20\): down"):
        await run_with_retries(failing(kind, calls), stop=trio.Event(), logger=_log,
                               give_up_after=20)
    assert 3 < len(calls) < 20
    assert calls[-1] - calls[0] <= 20
    retries = [r for r in caplog.records if r.getMessage() == "restarting after transient failure"]
    assert len(retries) == len(calls) - 1
    assert retries[0].fields["kind"] == kind.__name__


async def test_without_a_budget_retries_until_stopped(autojump_clock):
    calls: list = []
    stop = trio.Event()

    async def stopper():
        await trio.sleep(300)
        stop.set()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stopper)
        restarts = await run_with_retries(failing(SinkUnavailable, calls), stop=stop,
                                          logger=_log)
    assert restarts == len(calls) >= 10


async def test_cancellation_passes_through(autojump_clock):
    async def run_once():
        await trio.sleep_forever()
    with trio.move_on_after(1) as scope:
        await run_with_retries(run_once, stop=trio.Event(), logger=_log)
    assert scope.cancelled_caught
