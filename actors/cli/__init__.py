"""The ``pgrouter`` command line: one subcommand per module in ``actors.cli``.

Every subcommand module exposes ``add_parser(subparsers)`` and ``run(args) -> int``. Errors
that pgrouter raises on purpose (``router.errors.PgRouterError``) are printed as one line on
stderr with exit status 1 (2 for configuration errors); a user never sees a bare traceback.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys

from router.errors import ConfigError, PgRouterError

from .version import VersionAction

#: subcommand name -> module under actors.cli. Imported lazily so ``pgrouter --help``
#: stays fast and a missing optional extra (pyspark) only matters for its own command.
COMMANDS: dict[str, str] = {
    "decode": "decode",
    "run": "run",
    "check": "check",
    "setup": "setup",
    "materialize": "materialize",
    "apply": "apply",
    "status": "status",
    "snapshot": "snapshot",
    "init": "init",
    "console": "console",
    "verify": "verify",
}

HELP: dict[str, str] = {
    "decode": "decode captured pgoutput messages (LSN<TAB>HEX lines), or a topic's records, to JSON",
    "run": "stream a replication slot into Kafka topics",
    "check": "check a config against PostgreSQL and Kafka, printing every problem",
    "setup": "install the event trigger that puts publication changes into the WAL",
    "materialize": "materialize topics into Delta tables with Spark Structured Streaming",
    "apply": "apply topics to another PostgreSQL, tagged with a replication origin",
    "status": "the slot (lag, retained WAL) and the routes' topics, for a person or --json",
    "snapshot": "backfill tables into some routes' topics while the router streams",
    "init": "ask a live PostgreSQL and write a commented starter config",
    "console": "one web page over several routers' consoles (/api/status)",
    "verify": "check that each route's topics hold exactly what the route replicates of its tables",
}


def _available(names=None) -> dict[str, object]:
    found = {}
    for name, module in COMMANDS.items():
        if names is not None and name not in names:
            continue
        try:
            found[name] = importlib.import_module(f"actors.cli.{module}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("actors.cli"):
                continue  # not built yet
            raise
    return found


def build_parser(modules: dict[str, object]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgrouter",
        description="Fan one PostgreSQL logical replication slot out to many Kafka topics, "
        "each holding exactly what a publication would replicate.",
    )
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in modules.items():
        p = sub.add_parser(name, help=HELP.get(name), description=HELP.get(name))
        module.add_parser(p)  # type: ignore[attr-defined]
        p.set_defaults(_module=module)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (its first word that is not an option), if any."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    # only the named subcommand's module is imported (``run`` starts faster without the
    # others); every module for ``--help`` and for words that are not a subcommand
    command = _command(sys.argv[1:] if argv is None else argv)
    # the cyclic collector is off while the modules load, and what they made is moved out
    # of its reach (``gc.freeze``): they live as long as the process, and the collector's
    # passes over them cost a short command (``verify``) a tenth of its start
    collecting = gc.isenabled()
    gc.disable()
    try:
        modules = _available(None if command is None else {command})
    finally:
        gc.freeze()
        if collecting:
            gc.enable()
    parser = build_parser(modules)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args._module.run(args) or 0)
    except ConfigError as exc:
        print(f"pgrouter {args.command}: configuration error: {exc}", file=sys.stderr)
        return 2
    except PgRouterError as exc:
        print(f"pgrouter {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130

