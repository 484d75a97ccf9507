"""The lane of ``router._native.copy_records`` (a snapshot's COPY text to one route's
records, in C without the GIL) against ``router.snapshot.rows:copy_records_py`` for
``tests/router/test_native_twins.py``: the same records (topic, key bytes, value bytes,
headers) for every column kind the C path claims — text (any type printed as text: numeric,
timestamps, json…), integers, booleans — NULLs, escapes, multibyte text, a key of several
columns, no key, position headers; declined (None) only where the C side may decline."""

from __future__ import annotations

from router.formats.envelope import TableEncoder, TxContext
from router.pgoutput import Relation, RelationColumn
from router.snapshot.rows import RecordBlock

SAME, DECLINED = "same", "declined"
TEXT, INT8, INT4, BOOL, NUMERIC, TSTZ, JSONB = 25, 20, 23, 16, 1700, 1184, 3802
_TYPES = [TEXT, INT8, INT4, BOOL, NUMERIC, TSTZ, JSONB]
_TX = TxContext(xid=0, commit_lsn=(7 << 32) + 5, end_lsn=(7 << 32) + 6, commit_time=123456789)
_HEADERS = ("pgrouter.commit_lsn", b"%d" % _TX.commit_lsn)


def _encoder(types: list[int], keys: set[int], columns=None) -> TableEncoder:
    cols = tuple(RelationColumn(1 if i in keys else 0, f"c{i}", t, -1)
                 for i, t in enumerate(types))
    rel = Relation(relation_id=1, namespace="public", name="t\u00e9", replica_identity="d",
                   columns=cols)
    return TableEncoder(rel, route="r\"1", db="db", column_indexes=columns)


def check_copy_records(python, fast, case):
    types, keys, columns, data, first_seq, headers = case
    encoder = _encoder(types, keys, columns)
    encoder.recorder(_TX, "topic", headers, "pgrouter.seq")  # bound to the transaction
    got = fast(data, encoder._codec, "topic", encoder._head, encoder._mid, encoder._tail,
               _TX.end_lsn, first_seq, headers, "pgrouter.seq")
    if got is None:
        # declined: an escape or byte copy_rows declines, a non-canonical integer, a line of
        # another width
        assert (b"\\" in data or any(b >= 0x80 for b in data) or INT8 in types
                or INT4 in types or any(line.count(b"\t") != len(types) - 1
                                         for line in data.splitlines())), case
        return DECLINED
    want = python(data, encoder, _TX, "topic", _TX.end_lsn, first_seq, headers,
                  "pgrouter.seq")
    assert got == want, case
    # packed: the same records, read back from the bytes and offsets (what the native
    # producer reads; RecordBlock iterates them as it does)
    packed = fast(data, encoder._codec, "topic", encoder._head, encoder._mid, encoder._tail,
                  _TX.end_lsn, first_seq, headers, "pgrouter.seq", True)
    block = RecordBlock("topic", *packed, headers, "pgrouter.seq", first_seq)
    assert len(block) == len(want) and list(block) == want, case
    assert len(block.data) == sum(len(k) + len(v) for _, k, v, _ in want), case
    return SAME


_FIELDS = {TEXT: ["", "x", "h\u00e9llo \u20ac\U0001f600", "a\\tb\\nc\\\\d", '"q"\\\\/',
                  "\x01\x1f\x7f", "\\b\\f\\r\\v\\q", "\\N", "y" * 300],
           INT8: ["0", "-1", "9223372036854775807", "-9223372036854775808", "42", "\\N"],
           INT4: ["7", "-2147483648", "\\N"],
           BOOL: ["t", "f", "\\N"],
           NUMERIC: ["1.50", "-0.01", "NaN", "123456789012345678901234567890.5", "\\N"],
           TSTZ: ["2026-01-01 00:00:01+00", "infinity", "\\N"],
           JSONB: ['{"a": [1, "\\\\u00e9"]}', "null", "\\N"]}


def golden_copy_records():
    four = [TEXT, INT8, BOOL, NUMERIC]
    same = [
        (four, {1}, None, b"x\t1\tt\t1.50\n\\N\t-2\tf\t\\N\n", 0, None),
        (four, {1}, None, b"x\t1\tt\t1.50\n", 2 ** 40 + 3, _HEADERS),
        (four, {0, 1}, None, "h\u00e9\\t\\\\\t9\t\\N\tNaN\n".encode(), 5, None),  # 2-column key
        (four, set(), None, b"a\t2\tf\t0\n", 1, None),  # no key: null
        (four, {1}, (3, 1), b"x\t1\tt\t1.50\n", 1, None),  # a column list
        (four, {1}, None, b"", 0, None),
        (four, {1}, None, b"x\t1\tt\t1.50", 0, None),  # a last line without a newline
        ([TEXT], {0}, None, b"\n", 0, None),  # one empty text
        ([TEXT, TSTZ, JSONB, INT4], {3}, None,
         b'\\x\t2026-01-01 00:00:01+00\t{"a": 1}\t-5\n', 9, _HEADERS),
        ([TEXT], {0}, None, b"tail\\\n", 0, None),  # a trailing backslash is kept
    ]
    declined = [
        (four, {1}, None, b"x\t01\tt\t1\n", 0, None),  # not canonical: int() in Python
        (four, {1}, None, b"x\t1\tt\n", 0, None),  # a field short
        (four, {1}, None, b"x\t1\tt\t1\t2\n", 0, None),  # one too many
        (four, {1}, None, b"\\101\t1\tt\t1\n", 0, None),  # octal escape
        (four, {1}, None, b"\xff\t1\tt\t1\n", 0, None),  # not UTF-8
        (four, {1}, None, b"\xed\xa0\x80\t1\tt\t1\n", 0, None),  # a surrogate
    ]
    return [(SAME, c) for c in same] + [(DECLINED, c) for c in declined]


def gen_copy_records(rng):
    types = [rng.choice(_TYPES) for _ in range(rng.randrange(1, 7))]
    keys = set(rng.sample(range(len(types)), rng.randrange(0, min(3, len(types)) + 1)))
    lines = []
    for _ in range(rng.randrange(0, 15)):
        fields = [rng.choice(_FIELDS[t]) for t in types]
        if rng.random() < 0.02:
            fields.append("extra")
        if rng.random() < 0.02:
            fields[0] = rng.choice(["\\12", "\\x4f", "\udcff", "-0"])
        lines.append("\t".join(fields))
    data = "".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass")
    return (types, keys, None, data, rng.randrange(0, 2 ** 41),
            _HEADERS if rng.random() < 0.3 else None)
