"""Is a process alive, by its pid (the materializer's class archive lock, the dev stack's
services)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """``pid`` names a running process (one of another user counts; a zombie child of ours,
    exited and not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True
