"""``pgrouter apply -c FILE``: apply the router's topics to another PostgreSQL, each source
transaction atomically and once, tagged with a replication origin (``actors.apply.applier``)."""

from __future__ import annotations

import argparse

import trio

from router.apply_config import load_apply_config

from ..services import log
from ..apply.applier import Applier


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", required=True, help="TOML applier config file")
    p.add_argument("--until-caught-up", action="store_true",
                   help="exit 0 once every transaction whose END record was in the "
                        "transaction topic at start is applied")


def run(args: argparse.Namespace) -> int:
    cfg = load_apply_config(args.config)
    log.setup(cfg.log.level, cfg.log.format)
    return trio.run(Applier(cfg, until_caught_up=args.until_caught_up).run)
