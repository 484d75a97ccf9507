"""The streaming pipeline of ``pgrouter run``: trio tasks with bounded channels between.

Data flows ``slot_reader`` → ``decoder`` → (backfill) → ``origin_filter`` → ``router_actor``
→ ``sink`` → ``progress`` (and the flush LSN back to the slot reader); ``mailbox`` holds the
item types they exchange; ``actors.runner.supervisor`` wires them and restarts them on
transient failures. The slot reader (with its status loop), the sink and the confirm actor
are tasks of their own; the slot reader runs the decoder, backfill, origin filter and router
actors in its task (``mailbox.Inline``: each one's ``out`` is the next one's ``handle``), so
a WAL batch wakes one task there rather than five.

An actor closes its channels with ``with`` (synchronously), never ``async with``: closing one
end fails its peer at once (``BrokenResourceError``), the pipeline is cancelled, and an
``aclose`` checkpoint would then raise ``Cancelled`` over the actor's own failure, leaving
only the peer's echo to report (a record too large showed as a bare ``BrokenResourceError``).
"""
