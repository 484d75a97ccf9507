"""The streaming pipeline of ``pgrouter run``: one trio task per actor, bounded channels between.

Data flows ``slot_reader`` → ``decoder`` → ``origin_filter`` → ``router_actor`` → ``sink`` →
``progress`` (and the flush LSN back to the slot reader); ``mailbox`` holds the item types
they exchange; ``actors.runner.supervisor`` wires them and restarts them on transient failures.

An actor closes its channels with ``with`` (synchronously), never ``async with``: closing one
end fails its peer at once (``BrokenResourceError``), the pipeline is cancelled, and an
``aclose`` checkpoint would then raise ``Cancelled`` over the actor's own failure, leaving
only the peer's echo to report (a record too large showed as a bare ``BrokenResourceError``).
"""
