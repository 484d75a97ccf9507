"""``pgrouter run -c FILE``: stream the slot into Kafka until stopped (or caught up)."""

from __future__ import annotations

import argparse
import gc

import trio

from router.errors import ConfigError

from ..services import log
from .config_file import load

#: seconds of transient failures after which ``--until-caught-up`` gives up by default
UNTIL_CAUGHT_UP_RETRY_TIMEOUT = 120.0
#: allocations of tracked objects between young-generation collections (Python's default: 700)
GC_YOUNG_THRESHOLD = 10_000


def add_parser(p: argparse.ArgumentParser) -> None:
    add_service_options(p, config="TOML config file",
                        caught_up="every change committed before start is in Kafka and "
                                  "confirmed to the slot",
                        failures="transient failures (PostgreSQL or Kafka unreachable)")


def add_service_options(p: argparse.ArgumentParser, *, config: str, caught_up: str,
                        failures: str) -> None:
    """``-c``, ``--until-caught-up`` and ``--retry-timeout``, of ``pgrouter run`` and
    ``pgrouter apply``: ``caught_up`` says when the command exits 0, ``failures`` what is
    retried."""
    p.add_argument("-c", "--config", required=True, help=config)
    p.add_argument("--until-caught-up", action="store_true", help=f"exit 0 once {caught_up}")
    p.add_argument("--retry-timeout", type=float, metavar="SECONDS", default=None,
                   help=f"give up (exit 1) when {failures} last this long; default "
                        f"{UNTIL_CAUGHT_UP_RETRY_TIMEOUT:g} with --until-caught-up, otherwise "
                        "retry until stopped")


def retry_timeout(args: argparse.Namespace) -> float | None:
    """``--retry-timeout``, defaulting to ``UNTIL_CAUGHT_UP_RETRY_TIMEOUT`` with
    ``--until-caught-up`` (a batch job must end) and to none otherwise (a service retries)."""
    value = args.retry_timeout
    if value is None and args.until_caught_up:
        value = UNTIL_CAUGHT_UP_RETRY_TIMEOUT
    if value is not None and value <= 0:
        raise ConfigError("must be > 0 seconds", path="--retry-timeout")
    return value


def run(args: argparse.Namespace) -> int:
    # imported here: every command imports this module (``pgrouter apply`` for the retry
    # timeout), and the pipeline's modules take a third of a second to import
    from ..runner.supervisor import Supervisor

    cfg = load(args.config, "run")
    log.setup(cfg.log.level, cfg.log.format)
    tune_gc()
    return trio.run(Supervisor(cfg, until_caught_up=args.until_caught_up,
                               retry_timeout=retry_timeout(args)).run)


def tune_gc() -> None:
    """The garbage collector on a stream of small transactions: each one allocates a few
    tracked objects (its transaction, buffers, a chunk), so with Python's defaults a young
    collection runs every few hundred transactions and an old one, walking every module's
    objects, every hundred young ones: a fifth of the router's CPU (``bench/e2e.py --runs
    null`` with ``BENCH_GC_*``). What exists after start (modules, config) is frozen out of
    the collector's walks, and young collections run every ``GC_YOUNG_THRESHOLD``
    allocations (reference cycles are still collected, only less often)."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)
