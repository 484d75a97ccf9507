"""The dev stack's state file and lock: a reader never sees half a state.json, and callers
of ``up``/``down`` on one folder take turns."""

from __future__ import annotations

import multiprocessing
import threading
import time

from devstack.process import locked, write_atomic


def test_state_is_replaced_atomically(tmp_path):
    path = tmp_path / "state.json"
    small, large = b'{"a": 1}', b'{"b": "' + b"x" * 200_000 + b'"}'
    write_atomic(path, small)
    stop = threading.Event()
    seen = set()

    def reader():
        while not stop.is_set():
            seen.add(len(path.read_bytes()))

    t = threading.Thread(target=reader)
    t.start()
    for i in range(300):
        write_atomic(path, large if i % 2 else small)
    stop.set()
    t.join()
    assert seen <= {len(small), len(large)}, "a reader saw a partly written state file"
    assert not list(tmp_path.glob(".*.tmp"))


def _hold(root, started, seconds):
    with locked(root):
        started.set()
        time.sleep(seconds)


def test_up_on_one_folder_takes_turns(tmp_path):
    started = multiprocessing.Event()
    other = multiprocessing.Process(target=_hold, args=(tmp_path, started, 1.0))
    other.start()
    assert started.wait(30)
    t0 = time.monotonic()
    with locked(tmp_path):
        waited = time.monotonic() - t0
    other.join(30)
    assert waited > 0.5, "the lock did not make the second caller wait"
