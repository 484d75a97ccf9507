"""The materializer as one zip for ``spark-submit --py-files``: the job's modules under their
package path, so ``actors/materialize/job.py`` imports them on the driver and the executors.

Rules: only what the job imports goes in (of ``router/`` only
``postgres/arrays`` and ``errors``,
which import nothing; of ``actors/kafka`` only the registry client, for Avro topics, standard
library only; no msgspec-based ``config``), so a cluster needs nothing but pyspark and
delta-spark.

    python -m actors.materialize.bundle dist/pgrouter-materialize.zip
"""

from __future__ import annotations

import pathlib
import sys
import zipfile

PACKAGE = pathlib.Path(__file__).resolve().parent
ROUTER = PACKAGE.parent.parent / "router"
ROUTER_MODULES = ("__init__.py", "postgres/__init__.py", "postgres/arrays.py",
                  "errors.py")
KAFKA_MODULES = ("__init__.py", "registry.py")
MODULES = ("__init__.py", "settings.py", "columns.py", "maintenance.py", "toast.py", "tables.py",
           "class_archive.py", "schema_topic.py", "avro.py", "batch_meta.py", "merge.py",
           "job.py")


def write_bundle(target: str | pathlib.Path) -> pathlib.Path:
    target = pathlib.Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(PACKAGE.parent / "__init__.py", "actors/__init__.py")
        for name in ROUTER_MODULES:  # pure, importing nothing
            zf.write(ROUTER / name, f"router/{name}")
        for name in KAFKA_MODULES:  # the registry client (urllib) and its package's docstring
            zf.write(PACKAGE.parent / "kafka" / name, f"actors/kafka/{name}")
        for name in MODULES:
            zf.write(PACKAGE / name, f"actors/materialize/{name}")
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m actors.materialize.bundle OUT.zip", file=sys.stderr)
        return 2
    print(write_bundle(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
