"""The jars ``pgrouter materialize`` gives Spark when its config names none: Spark's Kafka
source and Delta, fetched from Maven Central on first use into ``<root>/cache`` (the dev
stack's ``.devstack`` by default)."""

from __future__ import annotations

import pathlib
import re

from ..services import maven


def _artifact(jar: pathlib.Path) -> str:
    """``jackson-core-2.13.5.jar`` -> ``jackson-core``."""
    return re.sub(r"-\d[\w.\-]*$", "", jar.stem)


def spark_jars(root: pathlib.Path) -> list[str]:
    """The jars Spark needs for Kafka and Delta (fetched on first use), less every artifact
    pyspark already ships: a second, older copy (jackson, hadoop, scala) breaks Spark."""
    import pyspark

    folder = maven.fetch("spark", pathlib.Path(root).resolve() / "cache")
    shipped = {_artifact(p) for p in (pathlib.Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return sorted(str(p) for p in folder.glob("*.jar") if _artifact(p) not in shipped)
