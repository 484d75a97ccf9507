"""The console script works as installed: help, version, unknown commands."""

import pathlib
import subprocess
import sys

from router import __version__

ROOT = pathlib.Path(__file__).resolve().parents[3]


def run(*args):
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], capture_output=True, text=True,
                          timeout=60)


def test_version():
    proc = run("--version")
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0] == f"pgrouter {__version__}"  # the rest: test_version.py


def test_help_lists_subcommands():
    proc = run("--help")
    assert proc.returncode == 0
    for name in ("run", "check", "snapshot", "apply", "materialize", "status"):
        assert name in proc.stdout
    assert "devstack" not in proc.stdout  # a checkout's `python -m devstack`, not installed


def test_the_dev_stack_runs_from_a_checkout():
    proc = subprocess.run([sys.executable, "-m", "devstack", "--help"], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "up" in proc.stdout and "--pg-port" in proc.stdout


def test_unknown_subcommand_is_a_usage_error_without_traceback():
    proc = run("no-such-command")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "invalid choice" in proc.stderr


def test_a_config_with_an_old_key_name_loads_with_one_warning_line(tmp_path, capsys):
    from actors.cli.config_file import load

    path = tmp_path / "r.toml"
    path.write_text('[source]\ndsn = "postgresql://x@h/db"\nslot = "s"\npublications = ["p"]\n'
                    '[kafka]\nbootstrap_servers = "k:9092"\n[[routes]]\nname = "r"\n'
                    'tables = ["public.t"]\n[snapshot]\nprogress_topic = "old.name"\n')
    cfg = load(str(path), "check")
    assert cfg.snapshot.state_topic == "old.name"
    err = capsys.readouterr().err.splitlines()
    assert err == [f"pgrouter check: warning: {path}: snapshot.progress_topic is now called "
                   "snapshot.state_topic; the old name is read for one more release"]


def test_console_refuses_bad_router_urls_and_token_files_in_one_line(tmp_path, capsys):
    from actors.cli import main

    assert main(["console", "--router", "ftp://x:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--router[0]" in err[0] and "http(s)://host:port" in err[0]
    assert main(["console", "--router", "http://127.0.0.1:1",
                 "--token-file", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--token-file" in err[0]
