"""The streaming pipeline of ``pgrouter run``: one trio task per actor, bounded channels between.

Data flows ``slot_reader`` → ``decoder`` → ``origin_filter`` → ``router_actor`` → ``sink`` →
``progress`` (and the flush LSN back to the slot reader); ``mailbox`` holds the item types
they exchange; ``supervisor`` wires them and restarts them on transient failures."""
