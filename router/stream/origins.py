"""Origin policies: which transactions to publish, by the replication origin they came from.

A transaction that carries an Origin message (``Transaction.origin_name``) was applied by a
replication session (a PostgreSQL subscription, or ``pgrouter apply``) tagged with that
origin; one without it was written locally. In multi-master setups publishing replicated
transactions again sends every change back where it came from: a loop.

Rules:

* A policy is ``"any"`` (everything, the default), ``"none"`` (local transactions only —
  PostgreSQL 16's ``origin = none``), or allow/deny lists of origin names, each entry an
  exact name or a glob pattern (``fnmatch``, case-sensitive). With lists, local
  transactions are published unless ``local = false``; a replicated one is published when
  it matches an ``allow`` entry (or ``allow`` is empty) and no ``deny`` entry.
* The router-wide ``[origin]`` policy applies to every route; ``[[routes]] origin``
  replaces it for that route (it does not narrow it).
* ``OriginRules.decide(origin)`` says, per transaction, whether every route, no route or
  only some routes publish it; decisions are cached per origin name (there are few).
* A transaction no route publishes is still confirmed to the slot in commit order: the
  origin filter forwards it as a ``FilteredTransaction`` (no changes), which the fanout
  turns into an empty final chunk.
* The filter can run on the server only when it is ``"none"`` for every route and the server
  is PostgreSQL ≥ 16 (pgoutput option ``origin 'none'``); otherwise it runs client-side.
"""

from __future__ import annotations

import fnmatch
from typing import Literal

import msgspec

from ..errors import ConfigError

ANY = "any"
NONE = "none"
_CACHE_LIMIT = 1024
SERVER_ORIGIN_MIN_VERSION = 160000


class OriginConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[origin]`` or ``[[routes]] origin = {…}``: a policy name or allow/deny lists."""

    policy: Literal["any", "none"] | None = None
    allow: list[str] = []
    deny: list[str] = []
    #: with lists: publish local transactions (no Origin message) too
    local: bool = True


#: what the TOML may say: ``origin = "none"`` or ``origin = {allow = [...]}`` / ``[origin]``
OriginSetting = str | OriginConfig


class OriginPolicy(msgspec.Struct, frozen=True):
    mode: Literal["any", "none", "lists"] = "any"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    local: bool = True

    def accepts(self, origin: str | None) -> bool:
        """Whether a transaction with this origin name (None: local) is published."""
        mode = self.mode
        if mode == ANY:
            return True
        if origin is None:
            return mode == NONE or self.local
        if mode == NONE:
            return False
        if self.allow and not any(_match(origin, p) for p in self.allow):
            return False
        return not any(_match(origin, p) for p in self.deny)

    def describe(self) -> str:
        if self.mode != "lists":
            return self.mode
        parts = [f"allow={list(self.allow)}" if self.allow else "",
                 f"deny={list(self.deny)}" if self.deny else "",
                 "" if self.local else "local=false"]
        return " ".join(p for p in parts if p)


ANY_POLICY = OriginPolicy()
NONE_POLICY = OriginPolicy(mode="none")


def _match(name: str, pattern: str) -> bool:
    if not any(c in pattern for c in "*?["):
        return name == pattern
    return fnmatch.fnmatchcase(name, pattern)


def parse_policy(setting: OriginSetting | None, *, path: str, source: str = "<config>"
                 ) -> OriginPolicy | None:
    """The policy a config value describes (None when not set). Errors name ``path``."""
    if setting is None:
        return None
    if isinstance(setting, str):
        if setting == ANY:
            return ANY_POLICY
        if setting == NONE:
            return NONE_POLICY
        raise ConfigError(f"must be \"any\", \"none\" or a table with allow/deny lists, got "
                          f"{setting!r}", path=path, source=source)
    for key in ("allow", "deny"):
        for i, pattern in enumerate(getattr(setting, key)):
            if not pattern:
                raise ConfigError("empty origin name", path=f"{path}.{key}[{i}]", source=source)
    lists = bool(setting.allow or setting.deny)
    if setting.policy is not None:
        if lists:
            raise ConfigError(f"policy = \"{setting.policy}\" cannot be combined with allow/deny "
                              "lists (lists alone define the policy)", path=f"{path}.policy",
                              source=source)
        if not setting.local:
            raise ConfigError("local = false needs allow/deny lists", path=f"{path}.local",
                              source=source)
        return ANY_POLICY if setting.policy == ANY else NONE_POLICY
    if not lists:
        if not setting.local:
            return OriginPolicy(mode="lists", local=False)
        return ANY_POLICY
    return OriginPolicy(mode="lists", allow=tuple(setting.allow), deny=tuple(setting.deny),
                        local=setting.local)


class FilteredTransaction(msgspec.Struct, frozen=True, gc=False):
    """A transaction no route publishes: only its position travels on, so the slot can
    confirm past it in commit order."""

    xid: int
    commit_lsn: int
    end_lsn: int
    origin_name: str | None


class RestrictedTransaction(msgspec.Struct, frozen=True):
    """A transaction only some routes publish (per-route origin overrides)."""

    transaction: object  # router.stream.transactions.Transaction
    routes: frozenset[str]


#: ``OriginRules.decide`` results besides a frozenset of route names
ALL_ROUTES = "all"
NO_ROUTE = "none"


class OriginRules:
    """The global policy and per-route overrides, decided once per origin name."""

    def __init__(self, default: OriginPolicy = ANY_POLICY,
                 routes: dict[str, OriginPolicy | None] | None = None):
        self.default = default
        self.per_route = {name: (p if p is not None else default)
                          for name, p in (routes or {}).items()}
        self._cache: dict[str | None, object] = {}

    @property
    def passes_everything(self) -> bool:
        """No transaction can ever be dropped: the filter need not run at all."""
        policies = set(self.per_route.values()) or {self.default}
        return policies == {ANY_POLICY}

    @property
    def everywhere_none(self) -> bool:
        policies = set(self.per_route.values()) or {self.default}
        return policies == {NONE_POLICY}

    def decide(self, origin: str | None):
        """``ALL_ROUTES``, ``NO_ROUTE`` or the frozenset of routes that publish it."""
        cached = self._cache.get(origin)
        if cached is not None:
            return cached
        if not self.per_route:
            result = ALL_ROUTES if self.default.accepts(origin) else NO_ROUTE
        else:
            names = frozenset(n for n, p in self.per_route.items() if p.accepts(origin))
            if len(names) == len(self.per_route):
                result = ALL_ROUTES
            elif not names:
                result = NO_ROUTE
            else:
                result = names
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[origin] = result
        return result

    def server_option(self, server_version: int) -> str | None:
        """The pgoutput ``origin`` option to push to the server, or None (filter here)."""
        if self.everywhere_none and server_version >= SERVER_ORIGIN_MIN_VERSION:
            return NONE
        return None

    def filtering_at(self, server_version: int) -> str:
        """Where filtering happens: ``server`` (the slot's ``origin`` option), ``client``
        (the origin filter actor) or ``off`` (nothing to drop)."""
        if self.passes_everything:
            return "off"
        return "server" if self.server_option(server_version) is not None else "client"

    def describe(self) -> dict[str, str]:
        out = {"default": self.default.describe()}
        out.update({f"route:{n}": p.describe() for n, p in self.per_route.items()
                    if p != self.default})
        return out


def rules_from_config(cfg) -> OriginRules:
    """``OriginRules`` of a validated ``router.config.router.Config``."""
    default = parse_policy(cfg.origin, path="origin") or ANY_POLICY
    return OriginRules(default, {r.name: parse_policy(r.origin, path=f"routes[{i}].origin")
                                 for i, r in enumerate(cfg.routes)})
