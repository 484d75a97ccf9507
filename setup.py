"""Build of the optional C accelerator ``router._native`` (everything else is in pyproject.toml).

The extension is optional: without a C compiler pgrouter installs and runs on its Python
code alone (slower; ``pgrouter check`` says which is in use)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("router._native", ["router/_native.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wno-missing-braces"])])
