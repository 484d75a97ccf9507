"""``pgrouter check`` of what the routes name in their tables: transforms (key columns
without ``transform_keys``, salts, columns no table has) and an outbox route's columns."""

from __future__ import annotations

import string

from router.config.router import qualified
from router.errors import ConfigError

from .catalog import load_primary_keys, routed_tables
from .transforms import route_transforms


async def transform_findings(sql, cfg, catalog) -> list[tuple[str, str]]:
    """``pgrouter check``: the routes' transforms of record-key columns without
    ``transform_keys = true`` (the key is the primary key, else the replica identity), salts
    that cannot be read, transformed columns no routed table has (a misspelt name would let
    the value out as it is), outbox columns a table lacks; as (config key path, message)."""
    out: list[tuple[str, str]] = []
    if not any(r.transforms or r.outbox for r in cfg.routes):
        return out
    found = routed_tables(cfg, catalog)
    for i, route in enumerate(cfg.routes):
        # a partitioned table the route names is what its partitions are published as
        # with publish_via_partition_root (routed_tables lists leaf tables' names only)
        found[i] = found[i] | {qualified(t) for t in route.tables
                               if qualified(t) in catalog.tables}
    out += _outbox_findings(cfg, catalog, found)
    names = sorted({t for i, r in enumerate(cfg.routes) if r.transforms for t in found[i]})
    pks = await load_primary_keys(sql, names)
    for i, route in enumerate(cfg.routes):
        if not route.transforms:
            continue
        try:
            transforms = route_transforms(route, i)
        except ConfigError as exc:
            out.append((exc.path or f"routes[{i}].transforms", str(exc)))
            continue
        out += _unmatched(route, i, transforms, found[i], catalog)
        if route.transform_keys:
            continue
        for schema, table in sorted(found[i]):
            info = catalog.tables.get((schema, table))
            key = pks.get((schema, table)) or (
                tuple(c.name for c in info.columns if c.key) if info else ())
            for j, t in enumerate(transforms):
                hit = [c for c in key if t.applies(schema, table, c)]
                if hit:
                    out.append((f"routes[{i}].transforms[{j}]", (
                        f"route {route.name!r}: column {schema}.{table}.{hit[0]} is part of the "
                        f"record key; a {t.kind} transform of it changes the key and so the "
                        "partition of every record of the row: set transform_keys = true to "
                        "accept that")))
    return out


def _unmatched(route, i: int, transforms, tables, catalog) -> list[tuple[str, str]]:
    have = set()
    for schema, table in tables:
        info = catalog.tables.get((schema, table))
        for c in info.columns if info else ():
            have.update((c.name, f"{schema}.{table}.{c.name}"))
    return [(f"routes[{i}].transforms[{j}].columns", f"route {route.name!r}: no table the "
             f"route takes has a column {c!r} (its values would leave untransformed)")
            for j, t in enumerate(transforms) for c in t.columns if c not in have]


def _outbox_findings(cfg, catalog, found) -> list[tuple[str, str]]:
    """The columns an outbox route names (``router.routing.outbox``) that its tables lack."""
    out = []
    for i, route in enumerate(cfg.routes):
        o = route.outbox
        if o is None:
            continue
        wanted = {"key": [o.key], "payload": [o.payload], "id": [o.id], "headers": o.headers,
                  "topic": [f for _, f, _, _ in string.Formatter().parse(o.topic)
                            if f and f != "route"]}
        for schema, table in sorted(found[i]):
            info = catalog.tables.get((schema, table))
            have = {c.name for c in info.columns} if info else set()
            for key, columns in wanted.items():
                out += [(f"routes[{i}].outbox.{key}", f"route {route.name!r}: outbox table "
                         f"{schema}.{table} has no column {c!r}") for c in columns
                        if c not in have]
    return out
