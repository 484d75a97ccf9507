"""``actors/`` is built in floors: a package imports only packages on floors below it (never
one above, never in a circle), as ``router/`` never imports ``actors/``. Every import counts,
also one inside a function."""

from __future__ import annotations

import ast
import pathlib

from tests.helpers import imported_modules

ROOT = pathlib.Path(__file__).resolve().parents[2]
ACTORS = ROOT / "actors"

#: package -> floor (higher floors use lower ones)
FLOORS = {
    "cli": 5,          # the pgrouter command
    "runner": 4,       # the wiring of `pgrouter run`: supervisor
    "verify": 4,       # `pgrouter verify`: topics against the source at one position
    "snapshot": 3,     # initial snapshots and backfills: sources feeding the pipeline's sink
    "pipeline": 2,     # the streaming actors
    "ha": 2,           # leadership of several routers on one slot (Kafka group)
    "apply": 2,        # `pgrouter apply`
    "services": 1,     # checks, catalog, SQL, logs, retries, metrics
    "kafka": 0,        # Kafka clients and their API knowledge
    "console": 0,      # the console's board, page and WSGI parts (mounted by services.http)
    "materialize": 2,  # the Spark job (its default jars fetched by services.maven)
}


def _imports(path: pathlib.Path) -> set[str]:
    """The ``actors`` packages a module imports (absolute or relative)."""
    return {parts[1] for parts in (name.split(".") for name in imported_modules(path, ROOT))
            if parts[0] == "actors" and len(parts) > 1}


def test_every_actors_package_has_a_floor():
    packages = {p.name for p in ACTORS.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(FLOORS)


def test_no_import_runs_back_up_or_sideways():
    wrong = []
    for path in ACTORS.rglob("*.py"):
        rel = path.relative_to(ACTORS).parts
        if len(rel) < 2 or "__pycache__" in rel:
            continue
        package = rel[0]
        for target in _imports(path) - {package}:
            if FLOORS[target] >= FLOORS[package]:
                wrong.append(f"{path.relative_to(ROOT)} ({package}, floor {FLOORS[package]}) "
                             f"imports actors.{target} (floor {FLOORS[target]})")
    assert wrong == []


def test_the_installed_packages_never_import_the_dev_stack():
    """``devstack/`` (the embedded services and the demo) is not installed with pgrouter:
    nothing in ``router/`` or ``actors/`` may import it, also inside a function."""
    wrong = []
    for folder in (ROOT / "router", ACTORS):
        for path in folder.rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom)
                         and not node.level else [])
                wrong += [f"{path.relative_to(ROOT)} imports {n}" for n in names
                          if n.split(".")[0] == "devstack"]
    assert wrong == []
    assert "devstack" not in (ROOT / "pyproject.toml").read_text().split(
        "[tool.setuptools.packages.find]")[1].split("\n[")[0]
