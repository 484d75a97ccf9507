"""The router actor: committed transactions in, Kafka-ready record chunks out, route by
route (``router.routing``). Keepalives and holds pass through in order."""

from __future__ import annotations

import trio

from router.routing import ChangeRouter
from router.transactions import NonTransactionalMessage, Transaction

from .mailbox import Hold, Keepalive


class FanoutActor:
    def __init__(self, *, router: ChangeRouter, inbox: trio.MemoryReceiveChannel,
                 out: trio.MemorySendChannel):
        self.router = router
        self.inbox = inbox
        self.out = out

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        route = self.router.route
        task_status.started()
        async with self.inbox, self.out:
            async for events in self.inbox:
                for ev in events:
                    if type(ev) is Transaction:
                        try:
                            for chunk in route(ev):
                                await self.out.send(chunk)
                        finally:
                            ev.changes.close()
                    elif type(ev) is NonTransactionalMessage:
                        await self.out.send(self.router.route_message(ev))
                    elif type(ev) in (Keepalive, Hold):
                        await self.out.send(ev)
                    else:  # PreparedOutcome in prepare mode: nothing to publish
                        continue
