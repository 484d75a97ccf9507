"""Following publication definitions at their WAL positions: the part of a ``ChangeRouter``
that holds them (``ChangeRouter.follow``).

Rules:

* After ``follow(definitions)`` the router takes its routes from a ``router.routing.definitions.
  Definitions`` shared by every router of a pipeline (``names`` picks some routes). A
  definitions message met while routing a transaction is applied there (its state record
  joins the transaction's records) and the router's plans are rebuilt before the next change,
  exactly where pgoutput's relation cache is invalidated; another router of the same pipeline
  picks the new version up at its next transaction (``stale``).
* Without ``follow`` such messages are dropped: they are never published as op 'm'.
* This part reads and writes only the definitions; what the router does with new routes is
  the router's (``ChangeRouter._adopt_definitions``).
"""

from __future__ import annotations

from .definitions import PREFIX

#: the "route" a new definitions topic is announced with (``RoutedChunk.new_topics``): the
#: sink creates it with the settings the supervisor keeps under this key
DEFINITIONS_ROUTE = ":definitions"


class DefinitionsFollower:
    __slots__ = ("definitions", "names", "version")

    def __init__(self, definitions, names: frozenset | None = None):
        self.definitions = definitions
        self.names = names
        self.version = -1  # of the routes last taken

    @property
    def topic(self) -> str:
        return self.definitions.topic

    def take_routes(self) -> list:
        """The routes of the current version (those named, when ``names``)."""
        defs, names = self.definitions, self.names
        self.version = defs.version
        return [r for r in defs.routes if names is None or r.name in names]

    def stale(self) -> bool:
        """Another router applied a definitions message since ``take_routes``."""
        return self.definitions.version != self.version

    def apply(self, change, tx):
        """A definitions message of ``tx``: applied; returns its state record."""
        return self.definitions.apply(change.message.content, lsn=change.lsn,
                                      commit_lsn=tx.commit_lsn, end_lsn=tx.end_lsn)


def is_definitions_message(change) -> bool:
    return change.message.prefix == PREFIX
