"""The optional C accelerator of the per-change hot path (``router/_native/``, one extension module).

Rules:

* The Python code is the reference; the accelerator returns ``None`` wherever its input is
  not the plain case it handles, and the Python code then runs (and raises the precise
  error). Outputs are identical byte for byte (``tests/router/test_native.py``).
* It is built by ``pip install`` when a C compiler is there (``setup.py``); without one,
  ``NATIVE`` is None and pgrouter runs on its Python code alone.
* ``PGROUTER_PURE_PYTHON=1`` in the environment turns it off (to compare the two).
"""

from __future__ import annotations

import os


def _load():
    if os.environ.get("PGROUTER_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from . import _native
    except ImportError:
        return None
    return _native  # router.pgoutput.reader configures it (UNCHANGED_TOAST, MAX_COLUMNS)


#: the ``router._native`` module, or None when it is not built or turned off
NATIVE = _load()


def describe() -> str:
    """One word for logs and ``pgrouter check``."""
    return "native" if NATIVE is not None else "python"
