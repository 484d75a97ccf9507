"""The decoder actor: WAL batches in, committed transactions out (``router.pgoutput`` +
``router.stream.transactions``). The earliest prepared transaction held until COMMIT PREPARED
travels as a ``Hold`` (its gid and prepare LSN with it), which caps every confirmation. A
keepalive position passes on only while no transaction or stream is open, so it can never
be confirmed past a change the pipeline has not yet delivered (past a held prepare the
``Hold``, sent first, keeps it from being confirmed); it lets ``--until-caught-up`` see that
everything but the held transaction is delivered.

Relations whose record key depends on a primary key the pipeline does not know (a table
created, or given REPLICA IDENTITY FULL, before the router first saw it) get their primary
key looked up (``lookup``) before the events that use them go on (``router.routing.keys``)."""

from __future__ import annotations

from time import perf_counter

from router.routing.keys import PrimaryKeys
from router.pgoutput import Decoder
from router.stream.transactions import TransactionAssembler

from .mailbox import Hold, Keepalive


class DecoderActor:
    def __init__(self, *, decoder: Decoder, assembler: TransactionAssembler,
                 out, metrics=None,
                 keys: PrimaryKeys | None = None, lookup=None):
        self.keys = keys
        self.lookup = lookup  # async (tables) -> {table: primary key columns}
        self.decoder = decoder
        self.metrics = metrics  # actors.services.metrics.Metrics or None
        self.assembler = assembler
        self.out = out
        self._hold = None
        self._observe = (metrics.stage_seconds.labels("decode").observe
                         if metrics is not None else None)

    def end(self) -> None:
        """No more WAL (it runs in the slot reader's task: ``mailbox.Inline``)."""
        self.out.close()

    async def handle(self, batch) -> None:
        """One WAL batch decoded and assembled; what it completes sent on."""
        assembler = self.assembler
        if self._observe is None:
            events = assembler.feed_batch(batch.messages, self.decoder.decode)
        else:
            started = perf_counter()
            events = assembler.feed_batch(batch.messages, self.decoder.decode)
            self._observe(perf_counter() - started)
        if assembler.relations.fresh:
            await self._look_up_keys(assembler.relations.take_fresh())
        if assembler.held != self._hold:
            hold = self._hold = assembler.held
            events.append(Hold(None) if hold is None else Hold(hold[0] - 1, hold[1], hold[0]))
        if batch.keepalive is not None and not assembler.buffering:
            events.append(Keepalive(batch.keepalive))
        if events:
            await self.out.send(events)

    async def _look_up_keys(self, relations: list) -> None:
        if self.keys is None or self.lookup is None:
            return
        missing = list(dict.fromkeys((r.namespace, r.name) for r in relations
                                     if self.keys.unknown(r)))
        if missing:
            for table, columns in (await self.lookup(missing)).items():
                self.keys.set(table, columns)
