"""Column transforms of the config's routes resolved for the core (``router.transforms``):
the salts read from their environment variables or files. A salt is never logged or echoed:
errors name the variable or the file, not its content. A file's one trailing newline is not
part of the salt (``echo secret > salt`` writes one)."""

from __future__ import annotations

import os
import string

from router.config import qualified
from router.errors import ConfigError
from router.routes import RouteSpec
from router.transforms import ColumnTransform, Salt


def _salt(t, at: str) -> Salt:
    if t.salt_env:
        value = os.environ.get(t.salt_env)
        if not value:
            raise ConfigError(f"the environment variable {t.salt_env} (the hash salt) is not "
                              "set or empty", path=f"{at}.salt_env")
        try:
            return Salt(value.encode(), f"${t.salt_env}")
        except UnicodeEncodeError:  # bytes the locale could not decode
            raise ConfigError(f"the environment variable {t.salt_env} (the hash salt) is not "
                              "UTF-8 text", path=f"{at}.salt_env") from None
    try:
        with open(t.salt_file, "rb") as fh:
            value = fh.read()
    except OSError as exc:
        raise ConfigError(f"cannot read the hash salt file {t.salt_file}: {exc.strerror}",
                          path=f"{at}.salt_file") from None
    if value.endswith(b"\n"):
        value = value[:-2] if value.endswith(b"\r\n") else value[:-1]
    if not value:
        raise ConfigError(f"the hash salt file {t.salt_file} is empty", path=f"{at}.salt_file")
    try:  # the digest is PostgreSQL's convert_to(salt || value, 'UTF8'): the salt is text
        value.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"the hash salt file {t.salt_file} is not UTF-8 text",
                          path=f"{at}.salt_file") from None
    return Salt(value, t.salt_file)


def route_transforms(route, index: int) -> tuple[ColumnTransform, ...]:
    """The ``[[routes.transforms]]`` of ``route`` (``routes[index]``), salts read."""
    out = []
    for i, t in enumerate(route.transforms):
        at = f"routes[{index}].transforms[{i}]"
        out.append(ColumnTransform(kind=t.kind, columns=tuple(t.columns),
                                   salt=_salt(t, at) if t.kind == "hash" else None,
                                   mask=t.mask, chars=t.chars))
    return tuple(out)


async def transform_findings(sql, cfg, catalog) -> list[tuple[str, str]]:
    """``pgrouter check``: the routes' transforms of record-key columns without
    ``transform_keys = true`` (the key is the primary key, else the replica identity), salts
    that cannot be read, transformed columns no routed table has (a misspelt name would let
    the value out as it is), outbox columns a table lacks; as (config key path, message)."""
    from .catalog import load_primary_keys, routed_tables

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


def route_spec(route, index: int, *, tables, ops, planner) -> RouteSpec:
    """The ``RouteSpec`` of ``[[routes]]`` entry ``index`` with its record options:
    tombstones, transforms with their salts read, an outbox route's events."""
    if route.outbox is not None:  # only inserts are events (router.outbox)
        ops = frozenset({"insert"}) & ops
    return RouteSpec(name=route.name, tables=tables, schemas=frozenset(route.schemas),
                     all_tables=route.all_tables, operations=ops, topic=route.topic,
                     outbox=route.outbox,
                     planner=planner, tombstones=route.tombstones,
                     transforms=route_transforms(route, index),
                     transform_keys=route.transform_keys)


def _outbox_findings(cfg, catalog, found) -> list[tuple[str, str]]:
    """The columns an outbox route names (``router.outbox``) that its tables lack."""
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
