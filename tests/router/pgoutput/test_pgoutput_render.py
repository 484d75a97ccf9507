"""``pgrouter decode``: rendering and the command itself."""

from __future__ import annotations

import json
import struct

import pytest

from actors.cli import main
from router.errors import DecodeError, TruncatedMessage
from router.pgoutput import StreamAbort, pg_time_to_iso, pg_time_to_unix_ms
from router.pgoutput.render import decode_lines, render_message

from conftest import GOLDEN


def run_decode(capsys, *args):
    status = main(["decode", *args])
    out, err = capsys.readouterr()
    return status, [json.loads(line) for line in out.splitlines()], err


def test_times():
    assert pg_time_to_iso(0) == "2000-01-01T00:00:00.000000+00:00"
    assert pg_time_to_iso(757_487_045_123_456) == "2024-01-02T05:04:05.123456+00:00"
    assert pg_time_to_iso(-1) == "1999-12-31T23:59:59.999999+00:00"
    assert pg_time_to_iso(2**63 - 1) == "infinity"
    assert pg_time_to_unix_ms(0) == 946_684_800_000
    assert pg_time_to_unix_ms(1_999) == 946_684_800_001


def test_decode_v1_text(capsys):
    status, rows, err = run_decode(capsys, str(GOLDEN / "v1_text.tsv"))
    assert status == 0 and err == ""
    assert rows[0]["type"] == "begin" and rows[0]["lsn"].startswith("0/")
    assert list(rows[0]) == ["lsn", "type", "final_lsn", "commit_time", "xid"]
    begin = rows[0]
    assert begin["commit_time"].endswith("+00:00") and len(begin["commit_time"]) == 32
    commit = next(r for r in rows if r["type"] == "commit")
    assert set(commit) == {"lsn", "type", "flags", "commit_lsn", "end_lsn", "commit_time"}
    assert commit["commit_lsn"] == begin["final_lsn"]
    relation = next(r for r in rows if r["type"] == "relation")
    assert relation["replica_identity"] == "d"
    assert relation["columns"][0] == {"flags": 1, "name": "id", "type_oid": 23,
                                      "type_modifier": -1}
    update = next(r for r in rows if r["type"] == "update")
    assert update["key"] is None and update["old"] is None
    assert update["new"][10] == {"unchanged_toast": True}
    delete = next(r for r in rows if r["type"] == "delete")
    assert set(delete) == {"lsn", "type", "relation_id", "key", "old"}
    truncate = next(r for r in rows if r["type"] == "truncate")
    assert truncate["options"] == 3 and len(truncate["relation_ids"]) == 2
    message = next(r for r in rows if r["type"] == "message")
    assert message["content_hex"] == b"non-transactional".hex()
    assert "xid" not in message
    origin = next(r for r in rows if r["type"] == "origin")
    assert origin == {"lsn": origin["lsn"], "type": "origin", "commit_lsn": "0/ABCDEF",
                      "name": "golden_node"}


def test_decode_binary_values(capsys):
    _, rows, _ = run_decode(capsys, str(GOLDEN / "v1_binary.tsv"))
    insert = next(r for r in rows if r["type"] == "insert")
    assert insert["new"][0] == {"binary": "00000001"}
    assert insert["new"][5] == {"binary": "deadbeef"}


def test_decode_stream_from_stdin(capsys, monkeypatch):
    import io
    import sys

    text = (GOLDEN / "v2_stream.tsv").read_text()
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    status, rows, _ = run_decode(capsys, "-", "--proto-version", "2")
    assert status == 0
    start = next(r for r in rows if r["type"] == "stream_start")
    assert set(start) == {"lsn", "type", "xid", "first_segment"}
    inside = rows[rows.index(start) + 1]
    assert inside["type"] == "relation" and inside["xid"] == start["xid"]
    abort = next(r for r in rows if r["type"] == "stream_abort")
    assert set(abort) == {"lsn", "type", "xid", "subxid"}


def test_decode_two_phase(capsys):
    _, rows, _ = run_decode(capsys, str(GOLDEN / "v3_twophase.tsv"))
    kinds = {r["type"]: r for r in rows}
    assert list(kinds["rollback_prepared"])[2:] == [
        "flags", "prepare_end_lsn", "rollback_end_lsn", "prepare_time", "rollback_time",
        "xid", "gid"]
    assert list(kinds["begin_prepare"])[2:] == ["prepare_lsn", "end_lsn", "prepare_time",
                                                "xid", "gid"]
    assert kinds["stream_prepare"]["gid"] == "golden_streamed"
    assert kinds["commit_prepared"]["gid"] == "golden_streamed"


def test_v4_abort_info_rendered():
    row = render_message(16, StreamAbort(1, 2, 0x100000010, 0))
    assert row == {"lsn": "0/10", "type": "stream_abort", "xid": 1, "subxid": 2,
                   "abort_lsn": "1/10", "abort_time": "2000-01-01T00:00:00.000000+00:00"}


@pytest.mark.parametrize("bad, fragment", [
    ("0/10\t42ff", "line 2: message ends before Begin fields"),
    ("0/10\tzz", "line 2: not hex data"),
    ("nope\t42", "line 2: not an LSN"),
    ("0/10 42", "line 2: expected LSN<TAB>HEX"),
])
def test_malformed_line_is_one_line_error(tmp_path, capsys, bad, fragment):
    good = "0/10\t" + (b"O" + struct.pack("!Q", 1) + b"n\x00").hex()
    path = tmp_path / "in.tsv"
    path.write_text(f"{good}\n{bad}\n{good}\n")
    status = main(["decode", str(path)])
    out, err = capsys.readouterr()
    assert status == 1
    assert len(out.splitlines()) == 1  # the good line before it was written
    assert err.count("\n") == 1 and fragment in err and "Traceback" not in err


def test_error_names_line_and_offset():
    lines = ["", "0/1\t" + (b"B" + b"\x00" * 10).hex()]
    with pytest.raises(TruncatedMessage) as info:
        list(decode_lines(lines))
    assert str(info.value) == ("line 2: message ends before Begin fields (10 bytes left) "
                               "at byte offset 1")
    assert isinstance(info.value, DecodeError) and info.value.offset == 1


def test_iso_cache_of_the_second_matches_the_full_conversion():
    """``pg_time_to_iso`` reuses the text of the last second it formatted; every value must
    still read as the full datetime conversion would render it, across seconds, before 2000,
    and at the edges of datetime's range."""
    from router.pgoutput import timestamps

    base = 757_487_045_000_000
    values = [base + d for d in (0, 1, 999_999, 1_000_000, 1_000_001, -1, -999_999,
                                 -1_000_000, 86_400_000_000)]
    values += [0, -1, 1, -1_000_000, -1_000_001, timestamps.DT_NOEND, timestamps.DT_NOBEGIN,
               -63_082_281_600_000_000, 252_423_993_599_999_999, 252_423_993_600_000_000,
               -63_082_281_600_000_001, base, base + 5, base]
    for us in values + values[::-1]:
        assert pg_time_to_iso(us) == timestamps._pg_time_to_iso(us), us
        assert pg_time_to_iso(us) == timestamps._pg_time_to_iso(us), us
