"""The decoder actor: WAL batches in, committed transactions out (``router.pgoutput`` +
``router.transactions``). A keepalive position passes on only while nothing is buffered
(no open, streamed or prepared transaction), so it can never be confirmed past a change the
pipeline has not yet delivered; the earliest held prepare travels as a ``Hold``."""

from __future__ import annotations

from time import perf_counter

import trio

from router.pgoutput import Decoder
from router.transactions import TransactionAssembler

from .mailbox import Hold, Keepalive


class DecoderActor:
    def __init__(self, *, decoder: Decoder, assembler: TransactionAssembler,
                 inbox: trio.MemoryReceiveChannel, out: trio.MemorySendChannel, metrics=None):
        self.decoder = decoder
        self.metrics = metrics  # actors.services.metrics.Metrics or None
        self.assembler = assembler
        self.inbox = inbox
        self.out = out

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        decode = self.decoder.decode
        assembler = self.assembler
        feed_batch = assembler.feed_batch
        hold = None
        observe = (self.metrics.stage_seconds.labels("decode").observe
                   if self.metrics is not None else None)
        task_status.started()
        async with self.inbox, self.out:
            async for batch in self.inbox:
                if observe is None:
                    events = feed_batch(batch.messages, decode)
                else:
                    started = perf_counter()
                    events = feed_batch(batch.messages, decode)
                    observe(perf_counter() - started)
                if assembler.hold_lsn != hold:
                    hold = assembler.hold_lsn
                    events.append(Hold(None if hold is None else hold - 1))
                if batch.keepalive is not None and assembler.idle:
                    events.append(Keepalive(batch.keepalive))
                if events:
                    await self.out.send(events)
