"""A PostgreSQL cluster of the dev stack: Debian's server binaries, our own data directory.

Rules: the binaries are installed with apt when missing (PostgreSQL ≥ 15 is required for
row filters and column lists); the cluster is initialised once with ``wal_level=logical`` and
room for slots, senders and prepared transactions; only a postmaster we started is stopped.
"""

from __future__ import annotations

import glob
import os
import pathlib
import pwd
import shutil
import signal
import subprocess

from .process import StackError, pid_alive, port_open, stop_pid, wait_until

MIN_MAJOR = 15
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "logical",
    "max_replication_slots": "40",
    "max_wal_senders": "40",
    "max_prepared_transactions": "20",
    "max_connections": "200",
    "shared_buffers": "256MB",
    "wal_sender_timeout": "60s",
    "timezone": "'UTC'",
    "log_timezone": "'UTC'",
    "logging_collector": "off",
    "log_min_messages": "warning",
}


def find_bindir() -> pathlib.Path | None:
    found = []
    for path in glob.glob("/usr/lib/postgresql/*/bin/postgres"):
        try:
            major = int(pathlib.Path(path).parent.parent.name)
        except ValueError:
            continue
        if major >= MIN_MAJOR:
            found.append((major, pathlib.Path(path).parent))
    return max(found)[1] if found else None


def install() -> pathlib.Path:
    """Install Debian's PostgreSQL server (root only) and return its bin directory."""
    bindir = find_bindir()
    if bindir is not None:
        return bindir
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StackError("PostgreSQL server binaries (>= 15) are missing; install them with "
                         "'apt-get install postgresql-15' (needs root)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql",
                  "postgresql-contrib"]):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise StackError(f"{' '.join(argv)} failed:\n{proc.stderr[-2000:]}")
    bindir = find_bindir()
    if bindir is None:
        raise StackError("apt installed PostgreSQL but no server >= 15 was found")
    return bindir


def _as_owner(argv: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: run them as the ``postgres`` user then."""
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


class Postgres:
    def __init__(self, root: pathlib.Path, port: int, name: str = "pg"):
        self.root = root / name
        self.port = port
        self.name = name
        self.data = self.root / "data"
        self.socket_dir = self.root / "run"
        self.log = self.root / "postgres.log"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def pid(self) -> int | None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if pid_alive(pid) else None

    def _chown(self) -> None:
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            for path in (self.root, self.socket_dir):
                path.mkdir(parents=True, exist_ok=True)
                os.chown(path, pw.pw_uid, pw.pw_gid)
            # the postgres user must be able to traverse to its data directory
            parent = self.root.parent
            while parent != parent.parent:
                mode = parent.stat().st_mode
                if not mode & 0o001:
                    os.chmod(parent, mode | 0o001)
                parent = parent.parent
        else:
            self.socket_dir.mkdir(parents=True, exist_ok=True)

    def init(self, bindir: pathlib.Path) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        self._chown()
        proc = subprocess.run(
            _as_owner([str(bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U",
                       "postgres", "-E", "UTF8", "--locale=C.UTF-8"]),
            capture_output=True, text=True)
        if proc.returncode != 0:
            raise StackError(f"initdb failed:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        conf = "".join(f"{k} = {v}\n" for k, v in SETTINGS.items())
        with open(self.data / "postgresql.conf", "a") as fh:
            fh.write("\n# pgrouter dev stack\n" + conf)

    def start(self, bindir: pathlib.Path) -> None:
        self._chown()
        proc = subprocess.run(
            _as_owner([str(bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w",
                       "-t", "60", "-o",
                       f"-p {self.port} -k {self.socket_dir}", "start"]),
            capture_output=True, text=True)
        if proc.returncode != 0:
            tail = self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""
            raise StackError(f"PostgreSQL did not start on port {self.port}:\n"
                             f"{proc.stdout}{proc.stderr}{tail}")
        wait_until(self.ready, timeout=60, what=f"PostgreSQL on port {self.port}", log=self.log)

    def ready(self) -> bool:
        if not port_open(self.port):
            return False
        import psycopg2

        with psycopg2.connect(self.dsn, connect_timeout=3) as conn, conn.cursor() as cur:
            cur.execute("select current_setting('wal_level')")
            return cur.fetchone()[0] == "logical"

    def stop(self) -> None:
        pid = self.pid()
        if pid is not None:
            # SIGINT: a fast shutdown (SIGTERM would wait for every client to disconnect)
            stop_pid(pid, timeout=60, sig=signal.SIGINT)
