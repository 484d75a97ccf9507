"""Says so when Kafka stops acknowledging while records wait for it.

Rule: the Kafka clients retry an unreachable broker by themselves until their delivery
timeout (a minute by default) and only then fail the pipeline, which the supervisor
restarts. That minute must not be silent: when records are in flight and no acknowledgement
arrived for ``STALL`` seconds, one warning line says the router is waiting for Kafka, and
one line says when acknowledgements resume. Reads the counters only; changes nothing.
"""

from __future__ import annotations

import logging

import trio

from ..services import log
from .confirmer import Stats

_log = log.get("sink")
STALL = 5.0
TICK = 0.5


class DeliveryWatch:
    def __init__(self, stats: Stats, *, stall: float = STALL):
        self.stats = stats
        self.stall = stall

    async def run(self) -> None:
        stats = self.stats
        acked, since, stalled = stats.acked_records, trio.current_time(), False
        while True:
            await trio.sleep(TICK)
            now = trio.current_time()
            in_flight = stats.sent_records - stats.acked_records
            if stats.acked_records != acked or in_flight <= 0:
                if stalled:
                    log.event(_log, "kafka acknowledges records again",
                              waited_s=round(now - since, 1))
                acked, since, stalled = stats.acked_records, now, False
            elif not stalled and now - since >= self.stall:
                stalled = True
                log.event(_log, "kafka has not acknowledged records; the client retries until "
                          "its delivery timeout, then the pipeline restarts",
                          level=logging.WARNING, in_flight=in_flight,
                          waited_s=round(now - since, 1))
