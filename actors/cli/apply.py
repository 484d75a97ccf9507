"""``pgrouter apply -c FILE``: apply the router's topics to another PostgreSQL, each source
transaction atomically and once, tagged with a replication origin (``actors.apply.applier``)."""

from __future__ import annotations

import argparse

import trio

from router.apply_config import load_apply_config

from ..services import log
from ..apply.applier import Applier
from .run import UNTIL_CAUGHT_UP_RETRY_TIMEOUT, retry_timeout


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", required=True, help="TOML applier config file")
    p.add_argument("--until-caught-up", action="store_true",
                   help="exit 0 once every transaction whose END record was in the "
                        "transaction topic at start is applied")
    p.add_argument("--retry-timeout", type=float, metavar="SECONDS", default=None,
                   help="give up (exit 1) when transient failures last this long; default "
                        f"{UNTIL_CAUGHT_UP_RETRY_TIMEOUT:g} with --until-caught-up, otherwise "
                        "retry until stopped")


def run(args: argparse.Namespace) -> int:
    cfg = load_apply_config(args.config)
    log.setup(cfg.log.level, cfg.log.format)
    return trio.run(Applier(cfg, until_caught_up=args.until_caught_up,
                            retry_timeout=retry_timeout(args)).run)
