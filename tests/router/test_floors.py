"""``router/`` is grouped by concern, in floors: a package imports only packages on floors below
it (never one above, never in a circle); ``errors`` and ``native`` are the ground. Every import
counts, also one inside a function."""

from __future__ import annotations

import pathlib

from tests.helpers import imported_modules

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROUTER = ROOT / "router"

#: package (or top-level module) -> floor (higher floors use lower ones)
FLOORS = {
    "verify": 6,      # pgrouter verify
    "config": 5,      # the configuration files
    "snapshot": 5,    # initial snapshots and backfills
    "routing": 4,     # publications and routes
    "formats": 3,     # the records and their values
    "stream": 3,      # messages -> whole transactions
    "apply": 2,       # pgrouter apply
    "delivery": 2,    # acknowledgements -> the confirmed position, exactly-once, HA
    "pgoutput": 2,    # the replication protocol's messages, decoded
    "rowfilter": 2,   # publication row filters
    "postgres": 1,    # PostgreSQL's own forms
    "errors": 0,      # the exception tree
    "native": 0,      # the C accelerator's loader
}


def _imports(path: pathlib.Path) -> set[str]:
    """The ``router`` packages and top-level modules a module imports (absolute or relative)."""
    return {parts[1] for parts in (name.split(".") for name in imported_modules(path, ROOT))
            if parts[0] == "router" and len(parts) > 1 and parts[1] in FLOORS}


def test_router_holds_packages_and_its_ground_only():
    loose = sorted(p.stem for p in ROUTER.glob("*.py") if p.stem != "__init__")
    packages = sorted(p.name for p in ROUTER.iterdir() if (p / "__init__.py").exists())
    assert loose == ["errors", "native"]
    assert set(packages) | set(loose) == set(FLOORS)


def test_no_import_runs_back_up_or_sideways():
    wrong = []
    for path in ROUTER.rglob("*.py"):
        rel = path.relative_to(ROUTER).parts
        if rel == ("__init__.py",) or "__pycache__" in rel:
            continue
        unit = rel[0][:-3] if len(rel) == 1 else rel[0]
        for target in _imports(path) - {unit}:
            if FLOORS[target] >= FLOORS[unit]:
                wrong.append(f"{path.relative_to(ROOT)} ({unit}, floor {FLOORS[unit]}) "
                             f"imports router.{target} (floor {FLOORS[target]})")
    assert wrong == []
