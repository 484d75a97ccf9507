"""Fuzzing the decoder with mutated golden messages: only DecodeError subclasses, no hangs.

Seeded (``PGROUTER_FUZZ_SEED``) and bounded both by iterations and by a wall-clock deadline,
so it is reproducible and can never stall the suite.
"""

from __future__ import annotations

import os
import random
import struct
import time

from router.errors import DecodeError
from router.pgoutput import Decoder

from conftest import CAPTURES

ITERATIONS = int(os.environ.get("PGROUTER_FUZZ_ITERATIONS", "100000"))
SEED = int(os.environ.get("PGROUTER_FUZZ_SEED", "20241102"))
DEADLINE_SECONDS = 120.0
#: Longest a single decode may take: a hang or quadratic blow-up shows up here.
SLOW_DECODE_SECONDS = 0.5

_INTERESTING = [b"\x00", b"\xff", b"\x7f", b"\x80", struct.pack("!i", -1),
                struct.pack("!i", 0x7FFFFFFF), struct.pack("!h", -1), struct.pack("!H", 0xFFFF),
                b"n", b"u", b"t", b"b", b"K", b"O", b"N", b"S", b"E"]


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] = rng.randrange(256)
        elif op == 1:
            buf[pos:pos] = rng.choice(_INTERESTING)
        elif op == 2:
            del buf[pos:pos + rng.randint(1, 8)]
        elif op == 3:
            buf[pos:pos + 4] = rng.choice(_INTERESTING)
        elif op == 4:
            del buf[pos:]
        else:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 6)))
    return bytes(buf)


def test_fuzz_only_decode_errors(golden):
    rng = random.Random(SEED)
    corpus = []
    for name, version in CAPTURES.items():
        seen = set()
        for _, data in golden[name]:
            if (data[:1], len(data)) not in seen:
                seen.add((data[:1], len(data)))
                corpus.append(data[:4096])
    deadline = time.monotonic() + DEADLINE_SECONDS
    decoders = [Decoder(v) for v in (1, 2, 3, 4)]
    errors = ok = 0
    for i in range(ITERATIONS):
        data = mutate(rng, rng.choice(corpus))
        decoder = rng.choice(decoders)
        started = time.monotonic()
        try:
            decoder.decode(data)
            ok += 1
        except DecodeError:
            errors += 1
        except Exception as exc:  # pragma: no cover - the failure being tested for
            raise AssertionError(f"iteration {i} (seed {SEED}): {data.hex()} raised "
                                 f"{type(exc).__name__}: {exc}") from exc
        elapsed = time.monotonic() - started
        assert elapsed < SLOW_DECODE_SECONDS, f"iteration {i}: {elapsed:.3f}s for {data.hex()}"
        assert started < deadline, f"fuzzing exceeded {DEADLINE_SECONDS}s after {i} iterations"
    assert ok + errors == ITERATIONS
    assert errors > ITERATIONS // 10 and ok > 0  # the mutations exercise both paths
