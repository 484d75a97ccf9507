"""The delivery watch says so when Kafka stops acknowledging records in flight, and when it
acknowledges again; an idle or progressing sink stays quiet. Virtual time."""

from __future__ import annotations

import logging

import trio

from actors.pipeline.delivery_watch import DeliveryWatch
from actors.pipeline.confirmer import Stats


def _lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "pgrouter.sink"]


async def test_stall_is_said_within_seconds_and_the_resume_too(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="pgrouter.sink")
    stats = Stats()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(DeliveryWatch(stats, stall=5).run)
        stats.sent_records = 10
        await trio.sleep(4)
        assert _lines(caplog) == []
        await trio.sleep(2)
        assert len(_lines(caplog)) == 1 and "not acknowledged" in _lines(caplog)[0]
        await trio.sleep(30)
        assert len(_lines(caplog)) == 1  # said once per stall
        stats.acked_records = 10
        await trio.sleep(1)
        assert "acknowledges records again" in _lines(caplog)[-1]
        nursery.cancel_scope.cancel()


async def test_progress_and_idleness_are_quiet(autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="pgrouter.sink")
    stats = Stats()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(DeliveryWatch(stats, stall=5).run)
        for _ in range(20):  # records acknowledged as they go
            stats.sent_records += 5
            await trio.sleep(1)
            stats.acked_records += 5
        await trio.sleep(60)  # nothing in flight
        nursery.cancel_scope.cancel()
    assert _lines(caplog) == []
