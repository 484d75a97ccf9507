"""A router with the delivery rule broken on purpose, for the proof that the fault tests can
fail: it counts a transaction as durable as soon as the sink registers it, before Kafka has
acknowledged anything, so the slot may be confirmed past records Kafka never got.

Run as ``python -m tests.e2e.broken_router run -c FILE`` (the command line of ``pgrouter``).
The fault is injected here, from the test side, by replacing the confirm actor's tracker:
nothing in pgrouter's own code (no setting, no environment variable) can turn the rule off."""

from __future__ import annotations

import sys

from actors.pipeline import confirmer
from router.delivery.confirmation import ConfirmationTracker


class ConfirmOnAccept(ConfirmationTracker):
    def begin(self, ticket: object, end_lsn: int) -> None:
        super().begin(ticket, end_lsn)
        super().done(ticket)  # durable before Kafka said so: the broken rule

    def done(self, ticket: object) -> None:
        pass  # already counted when it began


if __name__ == "__main__":
    confirmer.ConfirmationTracker = ConfirmOnAccept
    from actors.cli import main

    sys.exit(main())
