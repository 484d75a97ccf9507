"""The embedded dev stack shared by the tests, the benches and the demo: PostgreSQL + Apache
Kafka + a schema registry. Not part of the installed ``pgrouter`` (it lives beside ``router/``
and ``actors/``, imports them, and nothing of theirs imports it); run from a checkout:
``python -m devstack up|down|status``.

``up`` is idempotent: it reuses what runs, starts what does not, and waits until each service
really answers (a PostgreSQL query, a Kafka metadata request, the registry's
``GET /subjects``). State (ports, data, logs, the jar cache) lives under one ignored folder,
``.devstack/`` by default. ``down`` stops only processes this folder's pid files name.

PostgreSQL versions: the main node (``pg``) and its extra nodes (``pg2``…) run one major
version, chosen when the stack is first brought up (``pg_version``; the newest by default) and
kept after; asking an existing stack for another fails with a message. Servers of other
versions run beside them as ``v16``, ``v17``… (``versions=``), one per version, for the tests'
version matrix. ``standby=True`` adds a streaming standby of the main node (``standby``,
``devstack.standby``); ``kafka=False`` leaves Kafka out (a stack that is only a
PostgreSQL pair).

The schema registry (Apicurio, ``devstack.registry``; its Confluent-compatible API at
``StackInfo.registry_url``) runs beside Kafka and keeps its schemas in the main PostgreSQL;
``registry=False`` leaves it out (side stacks of fault tests and benches). A stack whose
registry was left out and is not running forgets its port, so ``status`` does not report it.
"""

from __future__ import annotations

import json
import pathlib

import msgspec

from actors.services import maven
from .kafka import Kafka
from . import distributions
from . import standby as standbys
from .postgres import Postgres
from .registry import Registry
from .process import StackError, locked, pick_port, port_free, wait_until, write_atomic
from .spark import SparkCluster
from actors.materialize.jars import spark_jars

__all__ = ["SparkCluster", "StackError", "StackInfo", "ensure_up", "down", "status", "spark_jars",
           "stop_service", "promote_standby"]


class StackInfo(msgspec.Struct, frozen=True):
    pg_dsn: str
    kafka_bootstrap: str
    pg_port: int
    kafka_port: int
    controller_port: int
    extra_pg: dict[str, str] = {}
    state_dir: str = ""
    #: the main node's (and its extra nodes') major version; stacks made before it was
    #: recorded ran Debian's 15
    pg_version: int = distributions.DEBIAN_VERSION
    #: servers of other major versions beside the main one: "16" -> DSN (node ``v16``)
    version_pg: dict[str, str] = {}
    #: DSN of the main node's streaming standby (node ``standby``), "" when there is none
    standby_pg: str = ""
    #: HTTP port of the schema registry (``devstack.registry``), 0 when there is none
    registry_port: int = 0

    @property
    def registry_url(self) -> str:
        """The schema registry's Confluent-compatible API ("" when there is none)."""
        if not self.registry_port:
            return ""
        return f"http://127.0.0.1:{self.registry_port}/apis/ccompat/v7"

    def dsn_for(self, version: int) -> str:
        """The DSN of a server of ``version`` in this stack (KeyError when none runs)."""
        if version == self.pg_version:
            return self.pg_dsn
        return self.version_pg[str(version)]


def _port(dsn: str) -> int:
    return int(dsn.rsplit(":", 1)[1].split("/")[0])


def _dsn(port: int) -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def _state_file(root: pathlib.Path) -> pathlib.Path:
    return root / "state.json"


def _load(root: pathlib.Path) -> StackInfo | None:
    try:
        return msgspec.json.decode(_state_file(root).read_bytes(), type=StackInfo)
    except (OSError, msgspec.DecodeError):
        return None


def _components(root: pathlib.Path, info: StackInfo):
    """The main PostgreSQL, Kafka, and every other PostgreSQL node by name (the extra nodes,
    then the servers of other versions)."""
    cache = root / "cache"
    pg = Postgres(root, info.pg_port, version=info.pg_version)
    kafka = Kafka(root, info.kafka_port, info.controller_port, cache)
    extras = {name: Postgres(root, _port(dsn), name=name, version=info.pg_version)
              for name, dsn in info.extra_pg.items()}
    for version, dsn in info.version_pg.items():
        extras[f"v{version}"] = Postgres(root, _port(dsn), name=f"v{version}",
                                         version=int(version))
    if info.standby_pg:
        extras["standby"] = Postgres(root, _port(info.standby_pg), name="standby",
                                     version=info.pg_version)
    return pg, kafka, extras


def _registry(root: pathlib.Path, info: StackInfo) -> Registry | None:
    if not info.registry_port:
        return None
    return Registry(root, info.registry_port, info.pg_port, root / "cache")


def _ports(info: StackInfo) -> set[int]:
    """Every port the stack gives one of its services (listening or not yet)."""
    return {info.pg_port, info.kafka_port, info.controller_port,
            *(_port(dsn) for dsn in (*info.extra_pg.values(), *info.version_pg.values())),
            *([_port(info.standby_pg)] if info.standby_pg else []),
            *([info.registry_port] if info.registry_port else [])}


def _move_stopped_off_taken_ports(root: pathlib.Path, info: StackInfo) -> StackInfo:
    """A stopped service whose remembered port another process took meanwhile (another
    checkout's stack, a system PostgreSQL) moves to a free port instead of failing; never to
    a port this stack already gives another of its services."""
    pg, kafka, extras = _components(root, info)
    registry = _registry(root, info)
    replace = msgspec.structs.replace
    taken = _ports(info)
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
    if registry is not None and registry.pid() is None and not port_free(info.registry_port):
        port = pick_port("auto", info.registry_port + 1, what="the schema registry",
                         flag="--no-registry", taken=taken)
        taken.add(port)
        info = replace(info, registry_port=port)
    extra, versioned = dict(info.extra_pg), dict(info.version_pg)
    for name, node in extras.items():
        if node.pid() is None and not port_free(node.port):
            port = pick_port("auto", node.port + 1, what=f"PostgreSQL {name}", flag="--pg-port",
                             taken=taken)
            taken.add(port)
            if name in extra:
                extra[name] = _dsn(port)
            elif name == "standby":
                info = replace(info, standby_pg=_dsn(port))
            else:
                versioned[name[1:]] = _dsn(port)
    return replace(info, extra_pg=extra, version_pg=versioned)


def extra_nodes(info: StackInfo, count: int) -> dict[str, str]:
    """``info.extra_pg`` grown to ``count`` extra PostgreSQL nodes (pg2, pg3, …) on free
    ports. The ports handed out here are not listening yet: none is given twice."""
    extra = dict(info.extra_pg)
    taken = _ports(info)
    for i in range(len(extra), count):
        name = f"pg{i + 2}"
        port = pick_port("auto", info.pg_port + 1 + i, what=f"PostgreSQL {name}",
                         flag="--pg-port", taken=taken)
        taken.add(port)
        extra[name] = _dsn(port)
    return extra


def version_nodes(info: StackInfo, versions) -> dict[str, str]:
    """``info.version_pg`` grown by a server for each of ``versions`` the main node does not
    run, on free ports (none handed out twice)."""
    versioned = dict(info.version_pg)
    taken = _ports(info)
    for version in sorted(set(versions)):
        distributions.check_version(version)
        if version == info.pg_version or str(version) in versioned:
            continue
        port = pick_port("auto", info.pg_port + 10 + version, what=f"PostgreSQL {version}",
                         flag="--pg-port", taken=taken)
        taken.add(port)
        versioned[str(version)] = _dsn(port)
    return versioned


def ensure_up(root: pathlib.Path, *, pg_port: str | int = "auto", kafka_port: str | int = "auto",
              extra_postgres: int = 0, spark: bool = False, pg_version: int | None = None,
              versions=(), standby: bool = False, kafka: bool = True,
              registry: bool = True) -> StackInfo:
    """Bring the stack up (or find it up) and return where its services listen. Concurrent
    calls on one folder take turns (a file lock): the second finds the first's services.

    ``pg_version`` is the main node's major version (None: the existing stack's, or
    ``distributions.DEFAULT_VERSION`` for a new one); ``versions`` adds a server of each of
    those versions beside it; ``registry`` runs the schema registry when Kafka runs."""
    root = pathlib.Path(root).resolve()
    with locked(root):
        return _ensure_up(root, pg_port=pg_port, kafka_port=kafka_port,
                          extra_postgres=extra_postgres, spark=spark, pg_version=pg_version,
                          versions=versions, standby=standby, kafka=kafka,
                          registry=registry)


def _ensure_up(root: pathlib.Path, *, pg_port, kafka_port, extra_postgres, spark, pg_version,
               versions, standby, kafka, registry) -> StackInfo:
    info = _load(root)
    if pg_version is not None:
        distributions.check_version(pg_version)
    if info is not None and pg_version is not None and pg_version != info.pg_version:
        raise StackError(f"the dev stack in {root} runs PostgreSQL {info.pg_version}, not "
                         f"{pg_version}; stop it (python -m devstack down), remove {root}, or "
                         "use another --dir")
    if info is None:
        pg_p = pick_port(pg_port, 5432, what="PostgreSQL", flag="--pg-port")
        k_p = pick_port(kafka_port, 9092, what="Kafka", flag="--kafka-port")
        c_p = pick_port("auto", k_p + 1 if k_p != 9092 else 9093, what="Kafka controller",
                        flag="--kafka-port")
        info = StackInfo(pg_dsn=f"postgresql://postgres@127.0.0.1:{pg_p}/postgres",
                         kafka_bootstrap=f"127.0.0.1:{k_p}", pg_port=pg_p, kafka_port=k_p,
                         controller_port=c_p, state_dir=str(root),
                         pg_version=pg_version or distributions.DEFAULT_VERSION)
    extra = extra_nodes(info, extra_postgres)
    info = msgspec.structs.replace(info, extra_pg=extra,
                                   version_pg=version_nodes(info, versions))
    if standby and not info.standby_pg:
        info = msgspec.structs.replace(info, standby_pg=_dsn(pick_port(
            "auto", info.pg_port + 30, what="PostgreSQL standby", flag="--pg-port",
            taken=_ports(info))))
    info = _with_registry_port(root, info, kafka and registry)
    info = _move_stopped_off_taken_ports(root, info)
    write_atomic(_state_file(root), msgspec.json.encode(info))

    pg, kafka_node, extras = _components(root, info)
    replica = extras.pop("standby", None)
    for node in (pg, *extras.values(), *([replica] if replica else [])):
        bindir = distributions.bindir(node.version, root / "cache")
        if node is replica:
            standbys.make(pg, replica, root / "cache")
        else:
            node.init(bindir)
            node.ensure_hba(bindir)
        if node.pid() is None:
            node.start(bindir)
        elif not node.ready():
            raise StackError(f"PostgreSQL at {node.data} runs but does not answer on {node.port}")
    if kafka:
        jars = kafka_node.init()
        if kafka_node.pid() is None:
            kafka_node.start(jars)
        else:  # ours runs (maybe still starting): it must be the one that answers
            wait_until(kafka_node.ready, timeout=120, what=f"Kafka on port {kafka_node.port}",
                       log=kafka_node.log, alive=lambda: kafka_node.pid() is not None)
    if kafka and registry:
        node = _registry(root, info)
        argv = node.init(info.pg_dsn)
        if node.pid() is None:
            node.start(argv)
        else:  # ours runs (maybe still starting)
            node.wait()
    if spark:
        maven.fetch("spark", root / "cache")
    return info


def _with_registry_port(root: pathlib.Path, info: StackInfo, wanted: bool) -> StackInfo:
    """A port for the schema registry when it is wanted and has none; a registry that is
    not wanted and not running gives its port up."""
    if wanted and not info.registry_port:
        return msgspec.structs.replace(info, registry_port=pick_port(
            "auto", 8081, what="the schema registry", flag="--no-registry",
            taken=_ports(info)))
    node = _registry(root, info)
    if not wanted and node is not None and node.pid() is None:
        return msgspec.structs.replace(info, registry_port=0)
    return info


def stop_service(root: pathlib.Path, name: str, *, crash: bool = False) -> None:
    """Stop one service of a running stack (``kafka``, ``registry``, ``pg``, ``pg2``,
    ``standby``…), e.g. for fault tests; ``crash`` kills a PostgreSQL postmaster with SIGKILL
    instead."""
    root = pathlib.Path(root).resolve()
    info = _load(root)
    if info is None:
        raise StackError(f"no dev stack in {root}")
    pg, kafka, extras = _components(root, info)
    registry = _registry(root, info)
    node = {"kafka": kafka, "pg": pg, **extras,
            **({"registry": registry} if registry else {})}.get(name)
    if node is None:
        raise StackError(f"the dev stack in {root} has no service {name!r}")
    if crash and isinstance(node, Postgres):
        standbys.kill(node)
    else:
        node.stop()


def promote_standby(root: pathlib.Path) -> str:
    """Promote the stack's standby to a primary; returns its DSN."""
    root = pathlib.Path(root).resolve()
    info = _load(root)
    if info is None or not info.standby_pg:
        raise StackError(f"no dev stack with a standby in {root}")
    _, _, extras = _components(root, info)
    node = extras["standby"]
    standbys.promote(node, distributions.bindir(node.version, root / "cache"))
    return info.standby_pg


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
    out["postgres"]["version"] = info.pg_version
    for name, node in extras.items():
        out[name] = {"dsn": node.dsn, "running": node.pid() is not None,
                     "version": node.version}
    if "kafka" in out and not out["kafka"]["running"] and not (root / "kafka").exists():
        del out["kafka"]  # a PostgreSQL-only stack (kafka=False)
    registry = _registry(root, info)
    if registry is not None:
        out["registry"] = {"url": info.registry_url, "running": registry.pid() is not None}
    cluster = SparkCluster(root)
    if cluster.running():
        out["spark"] = {"master": cluster.master_url, "running": True}
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
    stopped = SparkCluster(root).down()
    registry = _registry(root, info)
    if registry is not None and registry.pid() is not None:
        registry.stop()  # before the PostgreSQL that holds its storage
        stopped.append("registry")
    if kafka.pid() is not None:
        kafka.stop()
        stopped.append("kafka")
    # the standby first: a primary's smart shutdown waits for its walsenders' clients
    replica = extras.pop("standby", None)
    for node in ((replica,) if replica else ()) + (pg, *extras.values()):
        if node.pid() is not None:
            node.stop()
            stopped.append(node.name)
    return stopped


def dumps(obj: object) -> str:
    return json.dumps(obj, indent=2)
