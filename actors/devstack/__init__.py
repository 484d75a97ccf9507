"""The embedded dev stack shared by the tests and the demo: PostgreSQL + Apache Kafka.

``up`` is idempotent: it reuses what runs, starts what does not, and waits until each service
really answers (a PostgreSQL query, a Kafka metadata request). State (ports, data, logs, the
jar cache) lives under one ignored folder, ``.devstack/`` by default. ``down`` stops only
processes this folder's pid files name.
"""

from __future__ import annotations

import json
import pathlib
import re

import msgspec

from . import maven
from .kafka import Kafka
from .postgres import Postgres, install
from .process import StackError, locked, pick_port, port_free, wait_until, write_atomic

__all__ = ["StackError", "StackInfo", "ensure_up", "down", "status", "spark_jars", "stop_service"]


class StackInfo(msgspec.Struct, frozen=True):
    pg_dsn: str
    kafka_bootstrap: str
    pg_port: int
    kafka_port: int
    controller_port: int
    extra_pg: dict[str, str] = {}
    state_dir: str = ""


def _state_file(root: pathlib.Path) -> pathlib.Path:
    return root / "state.json"


def _load(root: pathlib.Path) -> StackInfo | None:
    try:
        return msgspec.json.decode(_state_file(root).read_bytes(), type=StackInfo)
    except (OSError, msgspec.DecodeError):
        return None


def _components(root: pathlib.Path, info: StackInfo):
    cache = root / "cache"
    pg = Postgres(root, info.pg_port)
    kafka = Kafka(root, info.kafka_port, info.controller_port, cache)
    extras = {name: Postgres(root, int(dsn.rsplit(":", 1)[1].split("/")[0]), name=name)
              for name, dsn in info.extra_pg.items()}
    return pg, kafka, extras


def _move_stopped_off_taken_ports(root: pathlib.Path, info: StackInfo) -> StackInfo:
    """A stopped service whose remembered port another process took meanwhile (another
    checkout's stack, a system PostgreSQL) moves to a free port instead of failing; never to
    a port this stack already gives another of its services."""
    pg, kafka, extras = _components(root, info)
    replace = msgspec.structs.replace
    taken = {info.pg_port, info.kafka_port, info.controller_port,
             *(node.port for node in extras.values())}
    if pg.pid() is None and not port_free(info.pg_port):
        port = pick_port("auto", info.pg_port + 1, what="PostgreSQL", flag="--pg-port",
                         taken=taken)
        taken.add(port)
        info = replace(info, pg_port=port,
                       pg_dsn=f"postgresql://postgres@127.0.0.1:{port}/postgres")
    if kafka.pid() is None and not (port_free(info.kafka_port)
                                    and port_free(info.controller_port)):
        port = pick_port("auto", info.kafka_port + 2, what="Kafka", flag="--kafka-port",
                         taken=taken)
        taken.add(port)
        ctl = pick_port("auto", port + 1, what="Kafka controller", flag="--kafka-port",
                        taken=taken)
        taken.add(ctl)
        info = replace(info, kafka_port=port, controller_port=ctl,
                       kafka_bootstrap=f"127.0.0.1:{port}")
    extra = dict(info.extra_pg)
    for name, node in extras.items():
        if node.pid() is None and not port_free(node.port):
            port = pick_port("auto", node.port + 1, what=f"PostgreSQL {name}", flag="--pg-port",
                             taken=taken)
            taken.add(port)
            extra[name] = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    return replace(info, extra_pg=extra)


def extra_nodes(info: StackInfo, count: int) -> dict[str, str]:
    """``info.extra_pg`` grown to ``count`` extra PostgreSQL nodes (pg2, pg3, …) on free
    ports. The ports handed out here are not listening yet: none is given twice."""
    extra = dict(info.extra_pg)
    taken = {info.pg_port, info.kafka_port, info.controller_port,
             *(int(dsn.rsplit(":", 1)[1].split("/")[0]) for dsn in extra.values())}
    for i in range(len(extra), count):
        name = f"pg{i + 2}"
        port = pick_port("auto", info.pg_port + 1 + i, what=f"PostgreSQL {name}",
                         flag="--pg-port", taken=taken)
        taken.add(port)
        extra[name] = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    return extra


def ensure_up(root: pathlib.Path, *, pg_port: str | int = "auto", kafka_port: str | int = "auto",
              extra_postgres: int = 0, spark: bool = False) -> StackInfo:
    """Bring the stack up (or find it up) and return where its services listen. Concurrent
    calls on one folder take turns (a file lock): the second finds the first's services."""
    root = pathlib.Path(root).resolve()
    with locked(root):
        return _ensure_up(root, pg_port=pg_port, kafka_port=kafka_port,
                          extra_postgres=extra_postgres, spark=spark)


def _ensure_up(root: pathlib.Path, *, pg_port, kafka_port, extra_postgres, spark) -> StackInfo:
    info = _load(root)
    if info is None:
        pg_p = pick_port(pg_port, 5432, what="PostgreSQL", flag="--pg-port")
        k_p = pick_port(kafka_port, 9092, what="Kafka", flag="--kafka-port")
        c_p = pick_port("auto", k_p + 1 if k_p != 9092 else 9093, what="Kafka controller",
                        flag="--kafka-port")
        info = StackInfo(pg_dsn=f"postgresql://postgres@127.0.0.1:{pg_p}/postgres",
                         kafka_bootstrap=f"127.0.0.1:{k_p}", pg_port=pg_p, kafka_port=k_p,
                         controller_port=c_p, state_dir=str(root))
    extra = extra_nodes(info, extra_postgres)
    info = _move_stopped_off_taken_ports(root, msgspec.structs.replace(info, extra_pg=extra))
    write_atomic(_state_file(root), msgspec.json.encode(info))

    pg, kafka, extras = _components(root, info)
    bindir = install()
    for node in (pg, *extras.values()):
        node.init(bindir)
        if node.pid() is None:
            node.start(bindir)
        elif not node.ready():
            raise StackError(f"PostgreSQL at {node.data} runs but does not answer on {node.port}")
    jars = kafka.init()
    if kafka.pid() is None:
        kafka.start(jars)
    else:  # ours runs (maybe still starting): it must be the one that answers
        wait_until(kafka.ready, timeout=120, what=f"Kafka on port {kafka.port}", log=kafka.log,
                   alive=lambda: kafka.pid() is not None)
    if spark:
        maven.fetch("spark", root / "cache")
    return info


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


def stop_service(root: pathlib.Path, name: str) -> None:
    """Stop one service of a running stack (``kafka``, ``pg``, ``pg2``…), e.g. for fault tests."""
    root = pathlib.Path(root).resolve()
    info = _load(root)
    if info is None:
        raise StackError(f"no dev stack in {root}")
    pg, kafka, extras = _components(root, info)
    node = {"kafka": kafka, "pg": pg, **extras}[name]
    node.stop()


def status(root: pathlib.Path) -> dict[str, object]:
    root = pathlib.Path(root).resolve()
    info = _load(root)
    if info is None:
        return {"running": False}
    pg, kafka, extras = _components(root, info)
    out: dict[str, object] = {
        "postgres": {"dsn": info.pg_dsn, "running": pg.pid() is not None},
        "kafka": {"bootstrap": info.kafka_bootstrap, "running": kafka.pid() is not None},
    }
    for name, node in extras.items():
        out[name] = {"dsn": info.extra_pg[name], "running": node.pid() is not None}
    out["running"] = all(v["running"] for v in out.values() if isinstance(v, dict))
    return out


def down(root: pathlib.Path) -> list[str]:
    root = pathlib.Path(root).resolve()
    if not root.exists():
        return []
    with locked(root):
        return _down(root)


def _down(root: pathlib.Path) -> list[str]:
    info = _load(root)
    if info is None:
        return []
    pg, kafka, extras = _components(root, info)
    stopped = []
    if kafka.pid() is not None:
        kafka.stop()
        stopped.append("kafka")
    for node in (pg, *extras.values()):
        if node.pid() is not None:
            node.stop()
            stopped.append(node.name)
    return stopped


def dumps(obj: object) -> str:
    return json.dumps(obj, indent=2)
