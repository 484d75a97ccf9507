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


#: the one module that reads the slot's name from the config: ``Source`` is built there and
#: hands the name to whoever needs it
SLOT_NAME_HOME = "runner/source.py"
_CONFIGS = {"cfg", "config", "conf"}


def _is_config(node: ast.AST) -> bool:
    """``cfg``, ``config``, ``self.cfg``, ``sup.config``…: a name for the loaded config."""
    return ((isinstance(node, ast.Name) and node.id in _CONFIGS)
            or (isinstance(node, ast.Attribute) and node.attr in _CONFIGS))


def _is_source_config(node: ast.AST, aliases: set[str]) -> bool:
    """``cfg.source`` (or a name bound to it, or one annotated ``SourceConfig``)."""
    return ((isinstance(node, ast.Attribute) and node.attr == "source"
             and _is_config(node.value))
            or (isinstance(node, ast.Name) and node.id in aliases))


def _aliases(tree: ast.AST) -> set[str]:
    """Names bound to ``cfg.source`` anywhere in a module (plain or tuple assignment), and
    parameters annotated ``SourceConfig``."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = ([(target, node.value)] if not isinstance(target, ast.Tuple) else
                         zip(target.elts, node.value.elts) if isinstance(node.value, ast.Tuple)
                         else [])
                for t, v in pairs:
                    if isinstance(t, ast.Name) and _is_source_config(v, set()):
                        out.add(t.id)
        elif isinstance(node, ast.arg) and node.annotation is not None \
                and "SourceConfig" in ast.unparse(node.annotation):
            out.add(node.arg)
    return out


def slot_name_reads(root: pathlib.Path) -> list[str]:
    """``file:line`` of every read of the slot's name from the config (``cfg.source.slot``,
    ``src.slot`` with ``src = cfg.source``, ``getattr(cfg.source, "slot")``) outside the
    module that builds ``Source``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == SLOT_NAME_HOME or "__pycache__" in rel:
            continue
        tree = ast.parse(path.read_text())
        aliases = _aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "slot" \
                    and _is_source_config(node.value, aliases):
                found.append(f"{rel}:{node.lineno}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id == "getattr" and len(node.args) >= 2
                  and _is_source_config(node.args[0], aliases)
                  and isinstance(node.args[1], ast.Constant) and node.args[1].value == "slot"):
                found.append(f"{rel}:{node.lineno}")
    return found


def test_the_slot_name_is_read_from_the_config_only_where_source_is_built():
    assert slot_name_reads(ACTORS) == []


def test_the_scan_finds_slot_name_reads(tmp_path):
    (tmp_path / "stray.py").write_text(
        "def a(cfg):\n    return cfg.source.slot\n"
        "def b(self):\n    src = self.cfg.source\n    return src.slot\n"
        "def c(cfg):\n    return getattr(cfg.source, 'slot')\n"
        "def d(src: SourceConfig):\n    return src.slot\n"
        "def e(source):\n    return source.slot\n")
    (tmp_path / "runner").mkdir()
    (tmp_path / "runner" / "source.py").write_text("def f(cfg):\n    return cfg.source.slot\n")
    assert slot_name_reads(tmp_path) == ["stray.py:2", "stray.py:5", "stray.py:7",
                                         "stray.py:9"]
