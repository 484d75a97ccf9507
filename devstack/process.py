"""Processes the dev stack starts: pid files, liveness, ports, stopping only our own."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import signal
import socket
import subprocess
import time

from actors.services.pids import pid_alive  # noqa: F401  (devstack.process.pid_alive)


class StackError(Exception):
    """The dev stack cannot be brought up; the message says what to do."""


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return not port_open(port)


@contextlib.contextmanager
def autocommit_cursor(dsn: str):
    """A cursor of a new autocommit connection to ``dsn``, closed on leaving."""
    import psycopg2

    conn = psycopg2.connect(dsn, connect_timeout=10)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            yield cur
    finally:
        conn.close()


def run_sql(dsn: str, *statements: str) -> None:
    """Each statement, in order, on one autocommit connection to ``dsn``."""
    with autocommit_cursor(dsn) as cur:
        for statement in statements:
            cur.execute(statement)


def query(dsn: str, sql: str, *args, fetch: bool = False):
    """``sql`` with ``args`` on its own autocommit connection; its rows when ``fetch``."""
    with autocommit_cursor(dsn) as cur:
        cur.execute(sql, args or None)
        return cur.fetchall() if fetch else None


def pip_target(target: pathlib.Path, wheel: tuple[str, str], gives: pathlib.Path,
               what: str) -> None:
    """``wheel`` (name, version) installed by pip into ``target`` once: a ``.complete`` mark
    says a former install is whole, a partial one is removed first; StackError naming
    ``what`` when pip fails or ``gives`` is not there after it."""
    import shutil
    import sys

    if (target / ".complete").exists():
        return
    if target.exists():
        shutil.rmtree(target)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--target", str(target), f"{wheel[0]}=={wheel[1]}"],
                          capture_output=True, text=True)
    if proc.returncode != 0 or not gives.exists():
        raise StackError(f"pip could not install {wheel[0]}=={wheel[1]} ({what}):\n"
                         f"{(proc.stdout + proc.stderr)[-1500:]}")
    (target / ".complete").write_text(wheel[1])


def pick_port(requested: str | int, default: int, *, what: str, flag: str,
              taken: set[int] | frozenset[int] = frozenset()) -> int:
    """``requested`` is a number or ``auto`` (first free port from ``default`` upwards that
    is not in ``taken``: ports given to services that are not listening yet)."""
    if str(requested) == "auto":
        for port in range(default, default + 200):
            if port not in taken and port_free(port):
                return port
        raise StackError(f"no free port for {what} near {default}")
    port = int(requested)
    if port in taken or not port_free(port):
        raise StackError(f"port {port} for {what} is taken by another process; "
                         f"choose another with {flag} PORT (or {flag} auto)")
    return port


def read_pid(path: pathlib.Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if pid_alive(pid) else None


def spawn(argv: list[str], *, log: pathlib.Path, cwd: pathlib.Path,
          env: dict[str, str] | None = None) -> int:
    """Start a daemon in its own session (so it outlives us) with output to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=cwd, env=env, start_new_session=True)
    return proc.pid


def stop_pid(pid: int, *, timeout: float = 30.0, sig: int = signal.SIGTERM) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_until(check, *, timeout: float, what: str, log: pathlib.Path | None = None,
               alive=None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            break
        try:
            if check():
                return
        except Exception as exc:  # the service is still starting
            last = exc
        time.sleep(0.3)
    tail = ""
    if log is not None and log.exists():
        tail = "\n  ".join(log.read_text(errors="replace").splitlines()[-12:])
        tail = f"\n  last lines of {log}:\n  {tail}"
    reason = "exited" if alive is not None and not alive() else f"not ready after {timeout:.0f}s"
    raise StackError(f"{what} {reason}" + (f" ({last})" if last else "") + tail)


def write_atomic(path: pathlib.Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so a reader sees the old or the new file, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@contextlib.contextmanager
def locked(root: pathlib.Path):
    """Hold the stack folder's lock: one ``up``/``down`` at a time per folder, so concurrent
    callers see each other's services instead of racing for the same ports."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
