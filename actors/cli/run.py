"""``pgrouter run -c FILE``: stream the slot into Kafka until stopped (or caught up)."""

from __future__ import annotations

import argparse

import trio

from router.config import load_config

from ..services import log
from ..pipeline.supervisor import Supervisor


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", required=True, help="TOML config file")
    p.add_argument("--until-caught-up", action="store_true",
                   help="exit 0 once every change committed before start is in Kafka and "
                        "confirmed to the slot")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    log.setup(cfg.log.level, cfg.log.format)
    return trio.run(Supervisor(cfg, until_caught_up=args.until_caught_up).run)
