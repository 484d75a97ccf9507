"""A snapshot's COPY text on the C path (``router.snapshot.rows``: ``text_path``,
``CopyText``, ``encode_text``): decided per table up front, the same chunk as the rows
parsed and recorded one by one, and encoded without holding the GIL (another thread runs
meanwhile: what lets two sessions encode at once)."""

from __future__ import annotations

import threading
import time

import pytest

from router.formats.envelope import TxContext
from router.native import NATIVE
from router.pgoutput import Relation, RelationColumn
from router.routing.change_router import ChangeRouter, RouteSpec
from router.snapshot.core import copy_rows
from router.snapshot.rows import CopyText, SnapshotRows, encode_text

TX = TxContext(xid=0, commit_lsn=1 << 30, end_lsn=(1 << 30) + 1, commit_time=0)
native = pytest.mark.skipif(NATIVE is None, reason="router._native off (PGROUTER_PURE_PYTHON=1)")


def _rows(types: tuple[int, ...], headers: bool = False) -> tuple[SnapshotRows, Relation]:
    cols = tuple(RelationColumn(1 if i == 0 else 0, f"c{i}", t, -1) for i, t in enumerate(types))
    rel = Relation(relation_id=7, namespace="public", name="t", replica_identity="d",
                   columns=cols)
    router = ChangeRouter([RouteSpec("a", tables=frozenset({("public", "t")})),
                           RouteSpec("b", tables=frozenset({("public", "t")}))],
                          db="postgres", primary_keys={("public", "t"): ("c0",)})
    return SnapshotRows(router, position_headers=headers), rel


PLAIN = (20, 25, 16, 1700, 1184)  # int8, text, bool, numeric, timestamptz
TEXT = (b"1\thello\\tworld\tt\t1.50\t2026-01-01 00:00:00+00\n"
        b"2\t\\N\tf\t\\N\t\\N\n" + "3\th\u00e9\t\\N\t-0.5\tinfinity\n".encode())


def test_the_c_path_is_decided_per_table():
    rows, rel = _rows(PLAIN)
    assert rows.text_path(rel) is (NATIVE is not None)
    floats, frel = _rows((20, 701))  # a float8 column: msgspec's repr, made in Python
    assert floats.text_path(frel) is False


@native
@pytest.mark.parametrize("headers", [False, True])
def test_copy_text_gives_the_chunk_of_its_rows(headers):
    rows, rel = _rows(PLAIN, headers)
    via_text = rows.chunk(rel, CopyText(TEXT, 3), TX, 40)
    other, _ = _rows(PLAIN, headers)
    via_rows = other.chunk(rel, copy_rows(TEXT), TX, 40)
    assert len(via_text.records) == 6  # two routes
    assert via_text.records == via_rows.records
    assert [s.schema_id for s in via_text.schemas] == [s.schema_id for s in via_rows.schemas]
    assert via_text.new_topics == via_rows.new_topics
    # declined (an octal escape COPY never writes): the Python path, the same rows
    odd = b"4\t\\101\tt\t1\t\\N\n"
    assert rows.chunk(rel, CopyText(odd, 1), TX, 0).records == \
        other.chunk(rel, copy_rows(odd), TX, 0).records


@native
def test_encoding_runs_without_the_gil():
    rows, rel = _rows(PLAIN)
    (_, (codec, topic, head, mid, tail, lsn_header)), _ = rows.text_parts(rel, TX)
    data = TEXT * 60_000  # 180k rows, a few hundred ms of C
    window: list[float] = []

    def encode():
        window.append(time.perf_counter())
        NATIVE.copy_records(data, codec, topic, head, mid, tail, 5, 0, lsn_header, "s")
        window.append(time.perf_counter())

    worker = threading.Thread(target=encode)
    ticks = []
    worker.start()
    while worker.is_alive():
        ticks.append(time.perf_counter())
    worker.join()
    start, end = window
    # parsing and encoding take about the first half of the call, without the GIL; making
    # the records' objects after it holds the GIL: this thread runs only in the first part
    inside = [t for t in ticks if start + 0.005 < t < start + (end - start) / 4]
    assert end - start > 0.04, "too little work to tell"
    assert len(inside) > 100, (len(inside), end - start)
