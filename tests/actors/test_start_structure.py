"""The start of ``pgrouter run`` keeps its shape: every query of ``pg_replication_slots``
lives in ``actors/services/slots.py`` (``Source`` in ``actors/runner/source.py`` and every
other caller go through it), and no function in ``actors/`` is longer than 80 lines."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
ACTORS = ROOT / "actors"
#: the one home of the slot's SQL, and the definitions trigger whose SQL reads the slots'
#: restart_lsn beside its own log in one statement (said in actors/services/slots.py)
SLOT_SQL_HOMES = {"services/slots.py", "services/publication_trigger.py"}
LONGEST = 80


def slot_queries(root: pathlib.Path) -> list[str]:
    """``file:line`` of every string constant naming ``pg_replication_slots`` outside the
    homes."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in SLOT_SQL_HOMES or "__pycache__" in rel:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and "pg_replication_slots" in node.value
                    and not _is_docstring(node, path)):
                found.append(f"{rel}:{node.lineno}")
    return found


def _is_docstring(node: ast.Constant, path: pathlib.Path) -> bool:
    docs = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = n.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docs.add(body[0].value.lineno)
    return node.lineno in docs


def long_functions(root: pathlib.Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST:
                    out.append(f"{path.relative_to(root).as_posix()}:{node.lineno} "
                               f"{node.name} ({lines} lines)")
    return out


def test_every_slot_query_is_in_services_slots():
    assert slot_queries(ACTORS) == []


def test_the_scan_finds_a_slot_query(tmp_path):
    (tmp_path / "stray.py").write_text(
        '"""Mentions pg_replication_slots in a docstring only."""\n'
        'Q = "select 1 from pg_replication_slots where slot_name = $1"\n')
    assert slot_queries(tmp_path) == ["stray.py:2"]


def test_no_function_in_actors_is_over_80_lines():
    assert long_functions(ACTORS) == []


def test_the_scan_finds_a_long_function(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(LONGEST))
    (tmp_path / "long.py").write_text(f"def f():\n{body}")
    assert long_functions(tmp_path) == ["long.py:1 f (81 lines)"]
