"""Column transforms of the config's routes resolved for the core (``router.routing.transforms``):
the salts read from their environment variables or files (``pgrouter check``'s findings on
them: ``route_checks``). A salt is never logged or echoed:
errors name the variable or the file, not its content. A file's one trailing newline is not
part of the salt (``echo secret > salt`` writes one)."""

from __future__ import annotations

import os

from router.config.router import qualified
from router.errors import ConfigError
from router.routing.routes import RouteSpec
from router.routing.transforms import ColumnTransform, Salt


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


def route_spec(route, index: int, *, tables, ops, planner) -> RouteSpec:
    """The ``RouteSpec`` of ``[[routes]]`` entry ``index`` with its record options:
    tombstones, transforms with their salts read, an outbox route's events."""
    if route.outbox is not None:  # only inserts are events (router.routing.outbox)
        ops = frozenset({"insert"}) & ops
    return RouteSpec(name=route.name, tables=tables, schemas=frozenset(route.schemas),
                     all_tables=route.all_tables, operations=ops, topic=route.topic,
                     outbox=route.outbox,
                     planner=planner, tombstones=route.tombstones,
                     transforms=route_transforms(route, index),
                     transform_keys=route.transform_keys)
