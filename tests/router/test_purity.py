"""router/ is the sans-I/O core: it must never import an I/O library."""

import ast
import pathlib

FORBIDDEN = {"trio", "trio_asyncio", "asyncio", "asyncpg", "psycopg2", "kafka", "confluent_kafka",
             "pyspark", "delta", "socket", "subprocess", "actors"}
ROOT = pathlib.Path(__file__).resolve().parents[2] / "router"


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
    files = list(ROOT.rglob("*.py"))  # no exception: the CLI is actors/cli
    assert files, "router/ has no modules?"
    offenders = {str(p.relative_to(ROOT)): sorted(imported_modules(p) & FORBIDDEN) for p in files}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_scanner_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import trio\nfrom kafka.producer import KafkaProducer\n")
    assert imported_modules(bad) & FORBIDDEN == {"trio", "kafka"}


# --- the layout (STYLE: aim at 400 lines, split by responsibility before 600) ----------------

PROJECT = ROOT.parent
#: modules are split by concept, not to pass a count: past AIM a module is listed below with
#: the concept that holds it together; past MAX_LINES it is split
AIM = 420
MAX_LINES = 600
LONG_MODULES: dict[str, str] = {}


def test_modules_stay_small():
    lines = {str(p.relative_to(PROJECT)): len(p.read_text().splitlines())
             for top in ("router", "actors") for p in (PROJECT / top).rglob("*.py")}
    assert {k: n for k, n in lines.items() if n > MAX_LINES} == {}
    assert {k: n for k, n in lines.items() if n > AIM and k not in LONG_MODULES} == {}
    assert {k for k in LONG_MODULES if lines.get(k, 0) <= AIM} == set()  # no stale reason


def test_actors_is_grouped_by_concern():
    """actors/ holds packages only (pipeline, kafka, apply, …), no loose modules."""
    loose = sorted(p.name for p in (PROJECT / "actors").glob("*.py") if p.name != "__init__.py")
    assert loose == []
