"""Golden pgoutput captures (``golden/*.tsv``, written by ``capture_golden.py``)."""

from __future__ import annotations

import pathlib

import pytest

from router.pgoutput.render import parse_line

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"
#: capture file -> the proto_version it was captured with
CAPTURES = {"v1_text.tsv": 1, "v1_binary.tsv": 1, "v2_stream.tsv": 2, "v3_twophase.tsv": 3}


def load_golden(name: str) -> list[tuple[int, bytes]]:
    rows = []
    for lineno, line in enumerate((GOLDEN / name).read_text().splitlines(), 1):
        parsed = parse_line(line, lineno)
        if parsed is not None:
            rows.append(parsed)
    return rows


@pytest.fixture(scope="session")
def golden():
    return {name: load_golden(name) for name in CAPTURES}
