"""Loading the router's config file for a subcommand: ``router.config.router`` parses it, and the
warnings it earns (a key under its old name) go to stderr, one line each, before the
command does anything."""

from __future__ import annotations

import sys

from router.config.router import Config, load_config


def load(path: str, command: str) -> Config:
    notes: list[str] = []
    cfg = load_config(path, notes)
    for note in notes:
        print(f"pgrouter {command}: warning: {note}", file=sys.stderr)
    return cfg
