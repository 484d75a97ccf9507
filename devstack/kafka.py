"""A single-node Apache Kafka in KRaft mode (broker and controller in one JVM).

Rules: jars come from Maven Central through ``maven.fetch`` (no tarball); storage is
formatted once with ``kafka.tools.StorageTool format --standalone``; the internal topics
have replication factor 1 so transactional and idempotent producers work on one node.
"""

from __future__ import annotations

import base64
import pathlib
import re
import subprocess
import uuid

from actors.services import maven
from .process import StackError, port_open, read_pid, spawn, stop_pid, wait_until


def cluster_id() -> str:
    """A KRaft cluster id as Kafka's ``Uuid.randomUuid`` makes them: 16 random bytes in
    URL-safe base64 without padding, never starting with '-' (a command line would read it
    as an option; about one id in 64 would)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def delete_topics(bootstrap: str, topics: list[str] | tuple[str, ...], *,
                  client_id: str = "pgrouter-dev") -> None:
    """Those of ``topics`` that exist, deleted (kafka-python's admin client)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id=client_id)
    try:
        present = set(admin.list_topics())
        gone = [t for t in topics if t in present]
        if gone:
            admin.delete_topics(gone)
    finally:
        admin.close()


def kraft_properties(node, *, node_id: int, quorum: str, replicas: int, min_isr: int,
                     tail: list[str]) -> str:
    """server.properties of a KRaft node (broker and controller) with ``node``'s ports and
    folder: ``quorum`` the line naming the controllers, ``replicas`` and ``min_isr`` what
    topics get, ``tail`` the lines that follow the shared ones."""
    return "\n".join([
        "process.roles=broker,controller",
        f"node.id={node_id}",
        quorum,
        f"listeners=PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{node.port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={node.root / 'data'}",
        "num.partitions=1",
        f"default.replication.factor={replicas}",
        f"min.insync.replicas={min_isr}",
        f"offsets.topic.replication.factor={replicas}",
        "offsets.topic.num.partitions=4",
        f"transaction.state.log.replication.factor={replicas}",
        f"transaction.state.log.min.isr={min_isr}",
        "transaction.state.log.num.partitions=4",
        f"share.coordinator.state.topic.replication.factor={replicas}",
        f"share.coordinator.state.topic.min.isr={min_isr}",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=true",
        "message.max.bytes=10485760",
        *tail,
        "",
    ])


class Kafka:
    def __init__(self, root: pathlib.Path, port: int, controller_port: int, cache: pathlib.Path):
        self.root = root / "kafka"
        self.port = port
        self.controller_port = controller_port
        self.cache = cache
        self.config = self.root / "server.properties"
        self.log = self.root / "kafka.log"
        self.pidfile = self.root / "kafka.pid"
        #: the KRaft cluster id to format with (a fresh one when None)
        self.cluster: str | None = None

    def format_args(self) -> list[str]:
        return ["--standalone"]

    def formatted_cluster_id(self) -> str | None:
        """The cluster id this node's storage was formatted with."""
        try:
            text = (self.root / "data" / "meta.properties").read_text()
        except OSError:
            return None
        m = re.search(r"^cluster\.id=(\S+)", text, re.M)
        return m.group(1) if m else None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def properties(self) -> str:
        return kraft_properties(
            self, node_id=1,
            quorum=f"controller.quorum.bootstrap.servers=127.0.0.1:{self.controller_port}",
            replicas=1, min_isr=1, tail=["log.retention.hours=168"])

    def pid(self) -> int | None:
        return read_pid(self.pidfile)

    def _java(self, jars: pathlib.Path, main: str, *args: str, heap: str = "256m") -> list[str]:
        return ["java", f"-Xmx{heap}", "-cp", f"{jars}/*",
                f"-Dlog4j2.configurationFile={self.root / 'log4j2.properties'}", main, *args]

    def init(self) -> pathlib.Path:
        jars = maven.fetch("kafka", self.cache)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "log4j2.properties").write_text(
            "rootLogger.level=WARN\nrootLogger.appenderRef.out.ref=out\n"
            "appender.out.type=Console\nappender.out.name=out\n"
            "appender.out.layout.type=PatternLayout\n"
            "appender.out.layout.pattern=[%d] %p %m (%c)%n\n")
        props = self.properties()
        formatted = (self.root / "data" / "meta.properties").exists()
        if formatted and self.config.exists() and self.config.read_text() == props:
            return jars
        if formatted:  # ports changed: start from empty storage rather than a stale quorum
            import shutil

            shutil.rmtree(self.root / "data")
        self.config.write_text(props)
        proc = subprocess.run(
            self._java(jars, "kafka.tools.StorageTool", "format", *self.format_args(),
                       f"--cluster-id={self.cluster or cluster_id()}", "-c", str(self.config)),
            capture_output=True, text=True)
        if proc.returncode != 0:
            raise StackError(f"formatting Kafka storage failed:\n{proc.stdout[-1500:]}"
                             f"{proc.stderr[-1500:]}")
        return jars

    def start(self, jars: pathlib.Path) -> None:
        pid = spawn(self._java(jars, "kafka.Kafka", str(self.config), heap="1g"),
                    log=self.log, cwd=self.root)
        self.pidfile.write_text(str(pid))
        wait_until(self.ready, timeout=120, what=f"Kafka on port {self.port}", log=self.log,
                   alive=lambda: self.pid() is not None)

    def ready(self) -> bool:
        if not port_open(self.port):
            return False
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000,
                                 client_id="pgrouter-devstack")
        try:
            admin.list_topics()
            cluster = admin.describe_cluster()
        finally:
            admin.close()
        # the broker that answers must be ours, not another stack's that took the port
        return (bool(cluster.get("brokers")) and self.pid() is not None
                and cluster.get("cluster_id") == self.formatted_cluster_id())

    def stop(self) -> None:
        pid = self.pid()
        if pid is not None:
            stop_pid(pid, timeout=60)
        self.pidfile.unlink(missing_ok=True)
