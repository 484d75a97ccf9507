"""The decoder's modules stay sans-I/O: no networking or async runtime imports."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3] / "router"
FORBIDDEN = {"trio", "asyncpg", "psycopg2", "kafka", "confluent_kafka", "socket", "asyncio"}
MINE = [*(ROOT / "pgoutput").glob("*.py"), ROOT / "stream" / "relations.py",
        ROOT / "formats" / "values.py", ROOT / "stream" / "transactions.py",
        ROOT / "stream" / "changes.py"]


def test_no_io_imports():
    for path in MINE:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_modules_stay_small():
    for path in MINE:
        assert len(path.read_text().splitlines()) <= 400, path.name
