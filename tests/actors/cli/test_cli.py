"""The console script works as installed: help, version, unknown commands."""

import subprocess
import sys

from router import __version__


def run(*args):
    return subprocess.run([sys.executable, "-m", "router", *args], capture_output=True, text=True,
                          timeout=60)


def test_version():
    proc = run("--version")
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0] == f"pgrouter {__version__}"  # the rest: test_version.py


def test_help_lists_subcommands():
    proc = run("--help")
    assert proc.returncode == 0
    assert "devstack" in proc.stdout


def test_unknown_subcommand_is_a_usage_error_without_traceback():
    proc = run("no-such-command")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "invalid choice" in proc.stderr
