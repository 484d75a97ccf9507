"""``make demo``: the dev stack, a small schema with publications, the router, a workload,
and what arrived on each topic. Steps that are not built yet say so and stop cleanly."""

from __future__ import annotations

import pathlib
import sys

import devstack
from actors.services.maven import MavenError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def main() -> int:
    try:
        info = devstack.ensure_up(ROOT / ".devstack")
    except (devstack.StackError, MavenError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    print(f"dev stack is up: postgres {info.pg_dsn}, kafka {info.kafka_bootstrap}")
    try:
        from devstack.demo import shop
    except ModuleNotFoundError:
        print("demo: the streaming pipeline is not built yet; the stack is left running "
              "(stop it with `.venv/bin/python -m devstack down`).")
        return 0
    return shop.run(info)


if __name__ == "__main__":
    sys.exit(main())
