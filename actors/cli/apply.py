"""``pgrouter apply -c FILE``: apply the router's topics to another PostgreSQL, each source
transaction atomically and once, tagged with a replication origin (``actors.apply.applier``)."""

from __future__ import annotations

import argparse

import trio

from router.config.applier import load_apply_config

from ..services import log
from ..apply.applier import Applier
from .run import add_service_options, retry_timeout


def add_parser(p: argparse.ArgumentParser) -> None:
    add_service_options(p, config="TOML applier config file",
                        caught_up="every transaction whose END record was in the "
                                  "transaction topic at start is applied",
                        failures="transient failures")


def run(args: argparse.Namespace) -> int:
    cfg = load_apply_config(args.config)
    log.setup(cfg.log.level, cfg.log.format)
    return trio.run(Applier(cfg, until_caught_up=args.until_caught_up,
                            retry_timeout=retry_timeout(args)).run)
