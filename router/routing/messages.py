"""Logical messages routed (a part of ``router.routing.change_router.ChangeRouter``): records on
the messages topic (``[kafka] messages_topic``), on the message routes by prefix
(``router.routing.message_routes``), and signals (``router.snapshot.signals``) kept as
(commit_lsn, seq, content) until the router's caller takes them. TRUNCATE markers and
definitions messages are the router's other parts' (``truncates``, ``following``)."""

from __future__ import annotations

from typing import Callable

from ..formats.envelope import TxContext, encode_message
from .message_routes import MessageRoutes


class LogicalMessages:
    def __init__(self, *, db: str, topic: str, message_routes: list | tuple,
                 signal_prefix: str, headers: Callable, new_topic: Callable[[str, str], None]):
        self.db = db
        self.topic = topic
        #: messages published by prefix (None: no such routes)
        self.routes = MessageRoutes(message_routes) if message_routes else None
        self.signal_prefix = signal_prefix
        self.signals: list = []
        #: (commit_lsn, seq) -> the records' Kafka headers (the router's)
        self.headers = headers
        self.new_topic = new_topic

    def transactional(self, change, tx: TxContext, seq: int, out: list) -> None:
        """The records of a message in a transaction, and its signal if it is one."""
        m = change.message
        if self.topic:
            key, value = encode_message(db=self.db, route="", tx=tx, lsn=change.lsn, seq=seq,
                                        transactional=True, prefix=m.prefix, content=m.content)
            out.append((self.topic, key, value, self.headers(tx.commit_lsn, seq)))
        if self.routes is not None:
            self.routes.records(m.prefix, m.content, self.headers(tx.commit_lsn, seq), out,
                                self.new_topic)
        if self.signal_prefix and m.prefix == self.signal_prefix:
            self.signals.append((tx.commit_lsn, seq, m.content))

    def non_transactional(self, m, lsn: int, out: list) -> None:
        """The records of a non-transactional message ``m`` at ``lsn``."""
        if self.topic:
            key, value = encode_message(db=self.db, route="", tx=None, lsn=lsn, seq=0,
                                        transactional=False, prefix=m.prefix, content=m.content)
            out.append((self.topic, key, value, self.headers(lsn, 0)))
        if self.routes is not None:
            self.routes.records(m.prefix, m.content, self.headers(lsn, 0), out, self.new_topic)

    def take_signals(self) -> list:
        signals = self.signals[:]
        self.signals.clear()  # the same list: the router shows it as its ``signals``
        return signals
