"""Decode what a live PostgreSQL sends right now (not only the committed golden bytes):
the capture script's workloads through the SQL interface, decoded and assembled."""

from __future__ import annotations

import importlib.util
import pathlib

import psycopg2
import pytest

from router.pgoutput import Decoder, Relation
from router.pgoutput.render import parse_line
from router.stream.relations import RelationCache
from router.stream.transactions import Transaction, TransactionAssembler

pytestmark = pytest.mark.services

CAPTURE = pathlib.Path(__file__).resolve().parents[1] / "router" / "pgoutput" / "capture_golden.py"


def load_capture():
    spec = importlib.util.spec_from_file_location("capture_golden", CAPTURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_live_capture_decodes_and_assembles(pg_dsn, tmp_path, monkeypatch):
    capture = load_capture()
    monkeypatch.setattr(capture, "GOLDEN", tmp_path)  # never overwrite the committed bytes
    try:
        capture.main(pg_dsn)
    finally:  # the FOR ALL TABLES publication and the schema would change later tests' view
        with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
            cur.execute("drop publication if exists golden_pub")
            cur.execute("drop schema if exists golden cascade")
    for name, version in (("v1_text.tsv", 1), ("v1_binary.tsv", 1), ("v2_stream.tsv", 2),
                          ("v3_twophase.tsv", 3)):
        decoder = Decoder(version)
        assembler = TransactionAssembler(RelationCache(), memory_limit=128 * 1024,
                                         spill_dir=str(tmp_path))
        events, relations = [], set()
        for lineno, line in enumerate((tmp_path / name).read_text().splitlines(), 1):
            lsn, data = parse_line(line, lineno)
            msg = decoder.decode(data)
            if type(msg) is Relation:
                relations.add(msg.name)
            events += assembler.feed(lsn, msg)
        txns = [e for e in events if isinstance(e, Transaction)]
        assert txns and relations, name
        assert all(t.change_count == len(list(t.changes)) for t in txns)
        assert assembler.open_streams == () and assembler.pending_prepared == {}


def test_server_version_supports_the_captures(pg_dsn):
    with psycopg2.connect(pg_dsn) as conn, conn.cursor() as cur:
        cur.execute("show server_version_num")
        assert int(cur.fetchone()[0]) >= 150000
        cur.execute("show wal_level")
        assert cur.fetchone()[0] == "logical"
