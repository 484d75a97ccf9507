"""A checkout where the C accelerator is not built runs on the Python twins: the folder of its
C sources (``router/_native/``) imports as an empty namespace package, which must not be
taken for the accelerator."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_a_checkout_without_the_built_module_falls_back_to_python(tmp_path):
    shutil.copytree(ROOT / "router", tmp_path / "router",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    assert not list((tmp_path / "router").glob("_native*.so"))
    code = ("import router.native as n, router.pgoutput as p, router.routing.change_router\n"
            "print(n.NATIVE is None, n.describe())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[0] == "True", proc.stdout
