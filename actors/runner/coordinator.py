"""One run of the pipeline ``wiring.build`` made: the sink, then its two sources in turn —
the initial snapshot (when this start created the slot for one) and the stream — under
one coordinator.

Rules:

* The sink starts first; the initial snapshot and the stream both feed its inbox
  (``Pipeline.inbox``), one after the other: the stream starts only once Kafka holds every
  snapshot record (in exactly-once mode: once the transactions holding them committed), so
  a change is never delivered before the row it changes. It starts from the slot's
  consistent point: nothing missed, nothing read twice.
* The sink's tickets (``Pipeline.tickets``) belong to this coordinator, which hands them to
  one reader at a time: to the initial snapshot until it returns (its ``SnapshotResult``),
  then to the confirm actor for the stream.
* One durability rule, "Kafka acknowledged every ticket up to the one holding it"
  (``router.delivery.confirmation``, ``actors.snapshot.tickets``), read in two places, and why:
  the stream's records and its backfills' chunks (watermark windows, inside the stream)
  carry stream positions, so the confirm actor turns that prefix into the slot's confirmed
  position and a backfill chunk is done once that position passes its window. The initial
  snapshot runs before the stream exists and confirms nothing — its positions lie before
  the consistent point the slot already starts from — so it reads the same prefix of
  tickets itself (``tickets.AckedPrefix``) to know which tables are done.
* A drain during the snapshot (``SnapshotResult.stopped``) closes the sink's inbox: the
  sink delivers what it holds and returns; the stream does not start and the next start
  finishes the snapshot by backfill. After a snapshot, tables rewritten while it ran
  (``left``) are handed to the backfill actor before the stream starts, and so are the
  snapshot state records the snapshot read and wrote (``StateStore.adopt``): the slot is
  new, only this router writes its records, and the topic is not read again (a read of the
  whole topic is a fifth of a second on a topic of 20,000 records).
* While streaming, the slot reader stops reading when a drain is asked for or the run
  caught up (``--until-caught-up``, every backfill done); the channels then empty in order.
"""

from __future__ import annotations

from typing import Callable

import trio

from ..snapshot.backfill import finish_initial
from ..snapshot.initial import InitialSnapshot, SnapshotResult
from .wiring import Pipeline


async def run(p: Pipeline, snapshot: InitialSnapshot | None, drain: trio.Event,
              streaming: Callable[[], None]) -> SnapshotResult | None:
    """The pipeline until it drained or caught up; the initial snapshot's result, if one
    ran. ``streaming`` is called once the slot reader started."""
    async with trio.open_nursery() as around:
        around.start_soon(p.monitor.run)
        around.start_soon(p.watch.run)
        try:
            return await _sources(p, snapshot, drain, streaming)
        finally:
            around.cancel_scope.cancel()


async def _sources(p: Pipeline, snapshot: InitialSnapshot | None, drain: trio.Event,
                   streaming: Callable[[], None]) -> SnapshotResult | None:
    result = None
    async with trio.open_nursery() as nursery:
        await nursery.start(p.sink.run)
        if snapshot is not None:
            result = await snapshot.run(p.inbox.clone(), p.tickets, drain)
            if result.stopped:
                p.inbox.close()  # the sink delivers what it holds and returns
                return result
            if result.left:  # rewritten while it ran
                finish_initial(p.backfill, list(result.left))
            if p.backfill is not None:  # the state topic is not read a second time
                p.backfill.store.adopt(snapshot.store)
        await nursery.start(p.confirm.run)
        if p.origin_filter is not None:
            p.origin_filter.start()
        if p.backfill is not None:
            await nursery.start(p.backfill.run)
        await nursery.start(p.slot.run)
        streaming()
        nursery.start_soon(_stop_reading_when, p, drain)
    return result


async def _stop_reading_when(p: Pipeline, drain: trio.Event) -> None:
    """The slot reader stops reading at a drain or once caught up (``Pipeline.done``)."""
    async with trio.open_nursery() as nursery:
        async def wait(ev):
            await ev.wait()
            nursery.cancel_scope.cancel()
        nursery.start_soon(wait, drain)
        nursery.start_soon(wait, p.done)
    p.slot.stop_reading()
