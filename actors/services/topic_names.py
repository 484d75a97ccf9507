"""Every topic the configured routes can produce, checked against the catalog
(``router.routing.topics``): by ``pgrouter check``, which lists every problem, and by ``run``, which
refuses to stream with the first one."""

from __future__ import annotations

from router.config.router import Config
from router.routing.publications import Catalog
from router.routing.topics import topic_problems

from .catalog import published_as


def route_topic_problems(cfg: Config, catalog: Catalog) -> list[tuple[str, str]]:
    """(config key path, message) for each illegal topic name, each topic two tables would
    share although the template names both schema and table, and each pair of topics Kafka
    cannot hold together."""
    routes = []
    for i, route in enumerate(cfg.routes):
        if any(p not in catalog.publications for p in route.publication_names()):
            continue  # reported by route_problems
        if route.outbox is not None:
            continue  # topics from the rows, checked as they are met (router.routing.outbox)
        routes.append((f"routes[{i}].topic", route.name, route.topic,
                       published_as(route, catalog)))
    k = cfg.kafka
    fixed = [("kafka.schema_topic", k.schema_topic), ("kafka.messages_topic", k.messages_topic),
             ("kafka.transactions_topic", k.transactions_topic)]
    return topic_problems(routes, fixed)


def refuse_bad_topics(cfg: Config, catalog: Catalog) -> None:
    """Raise a ``ConfigError`` naming the first topic problem, if there is any."""
    problems = route_topic_problems(cfg, catalog)
    if problems:
        path, message = problems[0]
        more = (f" (and {len(problems) - 1} more; `pgrouter check` lists them)"
                if len(problems) > 1 else "")
        raise ConfigError(message + more, path=path)
