"""router/ is the sans-I/O core: it must never import an I/O library."""

import ast
import pathlib

FORBIDDEN = {"trio", "trio_asyncio", "asyncio", "asyncpg", "psycopg2", "kafka", "confluent_kafka",
             "pyspark", "delta", "socket", "subprocess", "actors"}
ROOT = pathlib.Path(__file__).resolve().parents[2] / "router"
# the CLI entry point is allowed to reach the I/O side
EXEMPT = {ROOT / "__main__.py"}


def imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_router_imports_no_io_library():
    files = [p for p in ROOT.rglob("*.py") if p not in EXEMPT]
    assert files, "router/ has no modules?"
    offenders = {str(p.relative_to(ROOT)): sorted(imported_modules(p) & FORBIDDEN) for p in files}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_scanner_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import trio\nfrom kafka.producer import KafkaProducer\n")
    assert imported_modules(bad) & FORBIDDEN == {"trio", "kafka"}


# --- the layout (DESIGN/STYLE: modules stay small, split by responsibility before 600) -------

PROJECT = ROOT.parent
MAX_LINES = 420
#: modules allowed past MAX_LINES, with the reason (none today)
LONG_MODULES: dict[str, str] = {}


def test_modules_stay_small():
    long = {str(p.relative_to(PROJECT)): n
            for top in ("router", "actors") for p in (PROJECT / top).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert {k: v for k, v in long.items() if k not in LONG_MODULES} == {}


def test_actors_is_grouped_by_concern():
    """actors/ holds packages only (pipeline, kafka, apply, …), no loose modules."""
    loose = sorted(p.name for p in (PROJECT / "actors").glob("*.py") if p.name != "__init__.py")
    assert loose == []
