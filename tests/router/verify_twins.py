"""The lanes of ``verify_fold``, ``verify_copy`` and ``verify_sums`` for ``test_native_twins.py``: golden and
generated cases, and the check that runs both sides (``router.verify.digests``'s
``fold_batch_py`` and ``copy_sums_py`` are the references).

Rules:

* ``verify_fold`` gets messages shaped like confluent-kafka's (``error()``, ``partition()``,
  ``offset()``, ``key()``, ``value()``) holding JSON-format records and everything else a
  topic may hold (other shapes, bad JSON, tombstones, keyless records, updates with
  ``before``, unchanged TOAST, positions past the cut, older than what a key holds). Both
  sides start from the same rows and hand what they do not fold to the real feeder
  (``actors.verify.topic.Decoder.feeder``); the messages read, the fold's counts and the
  rows they leave are compared (the C side may leave more records to the feeder).
* ``verify_copy`` gets COPY text lines (escapes, NULLs, multibyte text, a line of another
  number of fields); both sides' returns or errors and accumulators are compared.
* ``verify_sums`` gets a fold's rows (``(names, digests)`` values: any number of column
  digests, then the bucket and the row's digest, ``MISSING`` among them) and the
  digester's buckets; it declines (None) a value of another shape, a bucket not below
  ``buckets`` or a negative digest other than ``MISSING``, which only the twin sums.
"""

from __future__ import annotations

import msgspec

import struct

from router.verify.fold import MISSING, key_of
from router.verify.digests import layout_of, row_digests_py

SAME = "same"
_enc = msgspec.json.encode


class Msg:
    __slots__ = ("k", "v", "p", "o", "e")

    def __init__(self, k, v, p=0, o=0, e=None):
        self.k, self.v, self.p, self.o, self.e = k, v, p, o, e

    def error(self):
        return self.e

    def partition(self):
        return self.p

    def offset(self):
        return self.o

    def key(self):
        return self.k

    def value(self):
        return self.v


def _outcome(fn, *args):
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 — the type and text are what is compared
        return "raised", type(exc), str(exc)


def check_verify_fold(python, fast, case):
    from actors.verify.topic import Decoder
    from router.verify.fold import TopicFold
    from router.verify.digests import digester

    msgs, ends, rows, cut, buckets = case
    out = []
    for fn in (python, fast):
        decoder = Decoder(None)
        fold = TopicFold(cut, digester(buckets))
        fold.rows = dict(rows)
        tools = (decoder._raw.decode, msgspec.json.Decoder().decode, key_of, layout_of,
                 decoder.feeder(fold, False), row_digests_py)
        got = _outcome(fn, msgs, ends, fold.rows, cut, buckets, tools)
        if got[0] == "ok":  # what the fold holds in the end, whichever way a record took
            read, after_cut, folded = got[1]
            got = ("ok", read, after_cut + fold.after_cut, folded + fold.records)
        out.append((got, fold.rows))
    assert out[0] == out[1], case
    return SAME


def _record(op="r", key=None, after=None, lsn=5, seq=0, before=None, toast=None, **extra):
    doc = {"op": op, "before": before, "after": after,
           "source": {"db": "d", "commit_lsn": lsn, "seq": seq, "table": "t"}}
    if toast is not None:
        doc["unchanged_toast"] = toast
    doc.update(extra)
    return _enc(key), _enc(doc)


def golden_verify_fold():
    cases = []
    plain = [_record(key={"id": i}, after={"id": i, "v": f"x{i}", "n": None, "f": 0.5,
                                           "b": True}, lsn=10 + i, seq=i) for i in range(4)]
    msgs = [Msg(k, v, 0, i) for i, (k, v) in enumerate(plain)]
    cases.append((msgs, {0: 10}, {}, 100, 7))
    cases.append((msgs, {0: 2}, {}, 100, 7))  # the end offset stops the read
    cases.append((msgs, {1: 10}, {}, 100, 7))  # another partition's end
    cases.append((msgs, {0: 10}, {}, 12, 7))  # past the cut
    held = {key_of({"id": 1}): (12 << 64 | 5, None)}
    cases.append((msgs, {0: 10}, held, 100, 7))  # the key holds a newer position
    odd = [
        Msg(*_record(key={"b": 2, "a": "é\n"}, after={"z": "\x01\"\\", "a": "é\n", "b": 2})),
        Msg(*_record(key={"id": 9}, after={"id": 9, "j": [1, {"a": 2}]})),  # not scalars
        Msg(*_record(op="u", key={"id": 1}, after={"id": 1}, before={"id": 2})),
        Msg(*_record(op="u", key={"id": 1}, after={"id": 1}, toast=["v"])),
        Msg(*_record(op="d", key={"id": 1}, before={"id": 1})),
        Msg(*_record(op="t", key=None)),
        Msg(None, _record(key={"id": 3}, after={"id": 3})[1]),  # keyless
        Msg(b'{"id":1}', None),  # a tombstone
        Msg(b'{"id":1}', b'{"op":"r",'),  # bad JSON
        Msg(b'{"id":1}', b'{"schema":{},"payload":{"op":"r"}}'),  # Connect
        Msg(*_record(key={"id": 5}, after={"id": 5}, lsn=None, seq=None)),
        Msg(*_record(key={"id": 6}, after={"id": 6}, lsn=-1)),
        Msg(*_record(key={"id": 7}, after={"id": 7}, lsn=2**70)),
        Msg(*_record(key={"id": 8}, after={"id": 8}), e="an error"),
        Msg(*_record(key={"id": 10}, after={"id": 2**70, "x": -2**63})),
        Msg(*_record(key={"id": 11}, after="not a row")),
    ]
    odd += [Msg(b'{"id": 12, "k": "\\u00e9\\ud83d\\ude00\\"\\n"}',
                _record(after={"k": "é😀\"\n", "id": 12, "f": 1e-7, "g": -0.0, "z": -12})[1]),
            Msg(b'{"id":-0}', _record(after={"id": 0})[1]),  # -0: the slow way's 0
            Msg(b'{"id":1,"id":2}', _record(after={"id": 2})[1]),  # a name twice
            Msg(b'{"id":1.5}', _record(after={"id": 1.5})[1]),  # a float key
            Msg(b'{"id":123456789012345678901}', _record(after={"x": 1})[1])]
    env = [  # envelopes the C scanner takes apart or leaves to msgspec
        b'{"op":"\\u0072","after":{"id":20},"source":{"commit_lsn":1}}',
        b'{"op":"r","op":"c","after":{"id":21},"source":{"commit_lsn":1}}',
        b' { "x" : [1, {"y": ["\\"", null]}], "op" : "u" , "after" : {"id" : 22} , '
        b'"source" : {"z": {"a": [true, false, -1.5e3]}, "seq": 2, "commit_lsn": 3} , '
        b'"unchanged_toast" : [ ] } ',
        b'{"op":"r","after":{"id":23},"source":{"commit_lsn":1.0}}',
        b'{"op":"r","after":{"id":24},"source":{"commit_lsn":18446744073709551616}}',
        b'{"op":"r","after":{"id":25},"source":{"commit_lsn":1,"commit_lsn":2}}',
        b'{"op":"r","after":{"id":26},"source":null}',
        b'{"op":"r","after":{"id":27},"source":{"commit_lsn":1},"x":"\\u00ff"}',
        b'{"op":"r","after":{"id":28},"source":{"commit_lsn":1}} x',
        b'{"op":"r","after":{"id":29},"unchanged_toast":["v"],"source":{"commit_lsn":1}}',
        b'{"op":"r","before":{"id":1},"after":{"id":30},"source":{"commit_lsn":1}}',
    ]
    odd += [Msg(_enc({"id": 20 + i}), v) for i, v in enumerate(env)]
    for i, m in enumerate(odd):
        m.o = i
    cases.append((odd, {0: 100}, {}, 100, 3))
    for lone in (b'"x":"\\ud800",', b'"source":{"db":"\\udc00x","commit_lsn":1},'):
        # a lone surrogate in a member the fold skips: msgspec refuses the record (the
        # feeder's one line), and so does the C scanner (it used to fold it)
        v = b'{"op":"r",' + lone + b'"after":{"id":31},"source":{"commit_lsn":1}}'
        v = v.replace(b',"source":{"commit_lsn":1}}', b"}") if b"source" in lone else v
        cases.append(([Msg(*plain[0]), Msg(b'{"id":31}', v, 0, 1)], {0: 10}, {}, 100, 7))
    bad = [Msg(*plain[0]), Msg(b'{"id":1', plain[1][1], 0, 1), Msg(*plain[2], 0, 2)]
    cases.append((bad, {0: 10}, {}, 100, 7))  # a key not JSON: the feeder's one line
    bad = [Msg(*plain[0]), Msg(b'[1]', plain[1][1], 0, 1)]
    cases.append((bad, {0: 10}, {}, 100, 7))  # a key not an object: the same
    for name in (b'"\xe9"', b'"id":1,"\xed\xa0\x80"', b'"\xc3(x"'):
        # a key's member name that is not UTF-8 (a foreign producer's bytes): msgspec refuses
        # it (the feeder's one line); the C scanner used to fold it as a key of its own
        bad = [Msg(*plain[0]), Msg(b"{" + name + b":2}", plain[1][1], 0, 1)]
        cases.append((bad, {0: 10}, {}, 100, 7))
    for odd_bytes in (b'"\xff":1,', b'"x":"\xff",', b'"\xc3(":[{"\xed\xa0\x80":2}],',
                      b'"source":{"\xe9":1,"commit_lsn":1},', b'"x":{"y":"\xf4\x90\x80\x80"},'):
        # a value with bytes that are not UTF-8 in a member the fold skips (a name, a string):
        # a consumer's JSON parser refuses the record, so do both folds (the feeder's one
        # line); the C scanner and msgspec's typed decoder used to fold it
        v = b'{"op":"r",' + odd_bytes + b'"after":{"id":32},"source":{"commit_lsn":5}}'
        v = v.replace(b',"source":{"commit_lsn":5}}', b"}") if b'"source"' in odd_bytes else v
        cases.append(([Msg(*plain[0]), Msg(b'{"id":32}', v, 0, 1)], {0: 10}, {}, 100, 7))
    return [(SAME, c) for c in cases]


_TEXTS = ["", "x", "é€😀", '"\\/', "\x01\x1f\x7f\b\f\n\r\t", "y" * 70]


def gen_verify_fold(rng):
    def value():
        kind = rng.random()
        if kind < 0.4:
            return rng.choice(_TEXTS) + str(rng.randrange(1000))
        if kind < 0.6:
            return rng.randint(-2**70, 2**70) if rng.random() < 0.1 else rng.randint(-99, 99)
        if kind < 0.7:
            return rng.uniform(-1e9, 1e9)
        if kind < 0.95:
            return rng.choice([None, True, False])
        return rng.choice([[1], {"a": "b"}])

    cols = rng.sample(["id", "a", "b", "c", "d", "e"], rng.randrange(1, 6))
    if "id" not in cols:
        cols.append("id")
    msgs, rows = [], {}
    for o in range(rng.randrange(1, 30)):
        key = {"id": rng.randrange(8)}
        if rng.random() < 0.2:
            key = {"id": key["id"], "a": value() if rng.random() < 0.5 else "k"}
        after = {c: key.get(c, value()) for c in cols}
        if rng.random() < 0.1:
            after = dict(reversed(list(after.items())))
        op = rng.choice("crrrrruuudtx")
        extra = {}
        if rng.random() < 0.1:
            extra["before"] = {"id": rng.randrange(8)}
        if rng.random() < 0.1:
            extra["toast"] = [rng.choice(cols)]
        kb, vb = _record(op, key, after if op != "d" else None, lsn=rng.randrange(1, 60),
                         seq=rng.randrange(3), **extra)
        if rng.random() < 0.05:
            vb = None if rng.random() < 0.5 else vb[:-3]
        if rng.random() < 0.05:
            kb = None if rng.random() < 0.5 else b"3"
        msgs.append(Msg(kb, vb, rng.choice([0, 0, 0, 1, 2]), o,
                        "e" if rng.random() < 0.03 else None))
        if rng.random() < 0.1:
            rows[key_of(key)] = (rng.randrange(1, 60) << 64, None)
    ends = {0: rng.randrange(0, 40), 1: 40}
    return msgs, ends, rows, rng.randrange(1, 70), rng.randint(1, 600)


def check_verify_copy(python, fast, case):
    data, keys, kinds, head, buckets = case
    out = []
    for fn in (python, fast):
        acc = bytearray(buckets * 24)
        out.append((_outcome(fn, data, keys, kinds, head, buckets, acc), bytes(acc)))
    assert out[0] == out[1], case
    return SAME


def golden_verify_copy():
    head = b'["a","b","id"]'
    cases = [
        (b"x\t\\N\t1\n", (2,), b"ssr", head, 7),
        (b"x\t\\N\t1\ny\tz\t2\n\\N\t\\N\t\\N\n", (2,), b"ssr", head, 1),
        (b"x\t\\N\t1\ny\tz\t2\n", (2,), b"sss", head, 1),  # "1" a string: not 1
        (b"true\t#3fb999999999999a\t7\n", (0, 2), b"rrr", head, 9),  # bare texts
        (b"a\\tb\\nc\\\\d\\\\N\t\\x41\\101\\7\\q\t\xc3\xa9\xe2\x82\xac\n", (0, 2), b"sss", head, 9),
        (b"\t\t\n", (1,), b"srs", head, 65536),  # empty texts
        (b"x\t1\n", (0,), b"ssr", head, 7),  # a field short
        (b"x\t1\t2\t3\n", (0,), b"ssr", head, 7),  # one too many
        (b"", (0,), b"ssr", head, 7),
        (b"\x01\x1f\t\"q\"\t5\\\n", (2,), b"ssr", head, 5),  # a trailing backslash
    ]
    return [(SAME, c) for c in cases]


def gen_verify_copy(rng):
    def field():
        kind = rng.random()
        if kind < 0.1:
            return "\\N"
        text = rng.choice(_TEXTS + ["plain", "a b", "12.5"]) + str(rng.randrange(100))
        return (text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
                .replace("\r", "\\r").replace("\b", "\\b").replace("\f", "\\f"))

    columns = rng.randrange(1, 6)
    lines = []
    for _ in range(rng.randrange(0, 12)):
        n = columns if rng.random() < 0.97 else columns + rng.choice([-1, 1])
        lines.append("\t".join(field() for _ in range(max(n, 1))))
    data = "".join(line + "\n" for line in lines).encode()
    keys = tuple(sorted(rng.sample(range(columns), rng.randrange(1, columns + 1))))
    head = _enc([f"c{i}" for i in range(columns)])
    kinds = bytes(rng.choice(b"sr") for _ in range(columns))
    return data, keys, kinds, head, rng.randint(1, 600)


DECLINED = "declined"


def check_verify_sums(python, fast, case):
    rows, buckets = case
    got = fast(rows, buckets)
    if got is None:
        assert not all(_summable(v, buckets) for v in rows.values()), case
        return DECLINED
    assert got == python(rows), case
    return SAME


def _summable(v, buckets: int) -> bool:
    if type(v) is not tuple or len(v) != 2 or type(v[1]) is not bytes or len(v[1]) < 16:
        return False
    b, h = struct.unpack_from("=qq", v[1], len(v[1]) - 16)
    return 0 <= b < buckets and h >= MISSING


def _row(bucket: int, digest: int, columns: int = 2) -> tuple:
    return (("a", "b")[:columns], struct.pack(f"={columns + 2}q", *range(columns), bucket,
                                              digest))


def golden_verify_sums():
    top = 2**60 - 1
    same = [({}, 1), ({b"1": _row(0, 5)}, 1), ({b"1": _row(3, 5), b"2": _row(3, 7)}, 9),
            ({b"1": _row(2, top), b"2": _row(2, top), b"3": _row(0, 0, 0)}, 3),
            ({b"1": _row(1, MISSING), b"2": _row(1, 9), b"3": _row(0, 4)}, 2),
            ({str(i).encode(): _row(i % 4, top - i) for i in range(500)}, 4)]
    declined = [({b"1": _row(4, 5)}, 4), ({b"1": _row(0, -2)}, 1), ({b"1": (("a",), b"x")}, 1),
                ({b"1": _row(0, 1), b"2": None}, 1), ({b"1": [("a",), _row(0, 1)[1]]}, 1),
                ({b"1": _row(-1, 1)}, 1)]
    return [(SAME, c) for c in same] + [(DECLINED, c) for c in declined]


def gen_verify_sums(rng):
    buckets = rng.randint(1, 600)
    rows = {}
    for i in range(rng.randrange(0, 40)):
        digest = MISSING if rng.random() < 0.03 else rng.randrange(0, 2**60)
        rows[str(i).encode()] = _row(rng.randrange(buckets), digest, rng.randrange(0, 4))
    if rows and rng.random() < 0.1:
        k = rng.choice(list(rows))
        rows[k] = rng.choice([None, _row(buckets, 1), _row(0, -5), (("a",), b"")])
    return rows, buckets
