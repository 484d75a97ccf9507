"""Routers that follow publication definitions at their WAL positions.

``FollowsDefinitions`` is mixed into ``routing.ChangeRouter``: after ``follow(definitions)``
the router takes its routes from a shared ``router.definitions.Definitions``. A definitions
message met while routing a transaction is applied there (its state record joins the
transaction's records) and the router's plans are rebuilt before the next change, exactly
where pgoutput's relation cache is invalidated; another router of the same pipeline picks the
new version up at its next transaction. Without ``follow`` such messages are dropped: they
are never published as op 'm'.
"""

from __future__ import annotations

from .definitions import PREFIX

#: the "route" a new definitions topic is announced with (``RoutedChunk.new_topics``): the
#: sink creates it with the settings the supervisor keeps under this key
DEFINITIONS_ROUTE = ":definitions"


class FollowsDefinitions:
    _definitions = None
    _definitions_version = -1
    _route_names: frozenset | None = None
    #: set when plans changed while routing a transaction (``route`` drops its bound plans)
    _routes_changed = False

    def follow(self, definitions, names: frozenset | None = None) -> None:
        self._definitions, self._route_names = definitions, names
        self._adopt_definitions()

    def _adopt_definitions(self) -> None:
        defs, names = self._definitions, self._route_names
        self.routes = [r for r in defs.routes if names is None or r.name in names]
        self._definitions_version = defs.version
        self._pending_routes = None
        self.forget_plans()
        self._plan_recorders = (None, {})
        self._routes_changed = True

    def _check_definitions(self) -> None:
        defs = self._definitions
        if defs is not None and defs.version != self._definitions_version:
            self._adopt_definitions()

    def _definitions_message(self, change, tx, out: list) -> bool:
        """True when ``change`` (a message) is a definitions message, applied if followed."""
        m = change.message
        if m.prefix != PREFIX:
            return False
        defs = self._definitions
        if defs is not None:
            out.append(defs.apply(m.content, lsn=change.lsn, commit_lsn=tx.commit_lsn,
                                  end_lsn=tx.end_lsn))
            if defs.topic not in self._seen_topics:
                self._seen_topics.add(defs.topic)
                self._new_topics.append((defs.topic, DEFINITIONS_ROUTE))
            self._adopt_definitions()
        return True
