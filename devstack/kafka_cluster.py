"""A Kafka cluster of several KRaft nodes on this machine (``devstack up --kafka-brokers 3``).

Rules: every node is broker and controller (a static quorum of all nodes, so one node may
die and the rest keep a majority); all nodes are formatted with one cluster id; topics get
replication factor = the number of nodes (at most 3) and ``min.insync.replicas`` = that
minus one, the internal topics too, so a produce with acks=all succeeds with one node down
and never with only one copy. Failure detection is tightened (a dead node is fenced after
3 s) so a leader change under load takes seconds. State (ports, cluster id) is
``kafka-cluster/cluster.json`` under the stack's folder, written atomically; a node is
ready when it answers with this cluster's id and all nodes are registered. The nodes' JVMs
run the client compiler only and the serial collector (quick starts of three JVMs on a few
cores; not a cluster to measure throughput on). ``down`` stops all nodes at once and kills
those left without a quorum after a few seconds (they would wait minutes for a controller).
"""

from __future__ import annotations

import os
import pathlib
import signal
import time

import msgspec

from .kafka import Kafka, cluster_id, kraft_properties
from .process import (StackError, locked, pick_port, pid_alive, port_free, port_open,
                      wait_until, write_atomic)

#: seconds the nodes still running are given once too few are left for a quorum (``down``)
QUORUMLESS_GRACE = 5.0


class ClusterState(msgspec.Struct):
    cluster_id: str
    ports: list[tuple[int, int]]  # (broker port, controller port) per node


class Node(Kafka):
    def __init__(self, root: pathlib.Path, index: int, state: ClusterState, cache: pathlib.Path):
        port, ctl = state.ports[index]
        super().__init__(root, port, ctl, cache)
        self.root = root / "kafka-cluster" / f"node{index + 1}"
        self.config = self.root / "server.properties"
        self.log = self.root / "kafka.log"
        self.pidfile = self.root / "kafka.pid"
        self.node_id = index + 1
        self.state = state
        self.cluster = state.cluster_id

    def format_args(self) -> list[str]:
        return []  # the quorum is the static controller.quorum.voters

    def _java(self, jars: pathlib.Path, main: str, *args: str, heap: str = "256m") -> list[str]:
        """Three nodes start side by side on a developer's few cores: the client compiler
        only and the serial collector take a node's start (and its storage format) from
        about 12 s to 5 s on two shared cores; the load a test cluster carries needs neither
        the optimising compiler nor parallel collection."""
        argv = super()._java(jars, main, *args, heap=heap)
        return [argv[0], "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", *argv[1:]]

    def properties(self) -> str:
        n = len(self.state.ports)
        rf, isr = min(n, 3), max(1, min(n, 3) - 1)
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_, c) in enumerate(self.state.ports))
        tail = ["broker.session.timeout.ms=3000", "broker.heartbeat.interval.ms=500",
                "controller.quorum.election.timeout.ms=1000",
                "controller.quorum.fetch.timeout.ms=2000", "replica.lag.time.max.ms=5000",
                "unclean.leader.election.enable=false", "log.retention.hours=168"]
        return kraft_properties(self, node_id=self.node_id,
                                quorum=f"controller.quorum.voters={voters}", replicas=rf,
                                min_isr=isr, tail=tail)

    def start(self, jars: pathlib.Path) -> None:
        """Start without waiting: a node alone has no quorum; the cluster waits for all."""
        from .process import spawn

        pid = spawn(self._java(jars, "kafka.Kafka", str(self.config), heap="384m"),
                    log=self.log, cwd=self.root)
        self.pidfile.write_text(str(pid))

    def ready(self) -> bool:
        from kafka import KafkaAdminClient

        # a closed port first, and a short bootstrap: a client that finds no node (or one
        # whose metadata has no brokers yet) backs off longer and longer and fails only at
        # its bootstrap timeout (30 s by default), long after the node came up
        if self.pid() is None or not port_open(self.port):
            return False
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000,
                                 bootstrap_timeout_ms=5000, client_id="pgrouter-devstack")
        try:
            cluster = admin.describe_cluster()
        finally:
            admin.close()
        return (len(cluster.get("brokers") or ()) == len(self.state.ports)
                and cluster.get("cluster_id") == self.state.cluster_id)


def existing_clusters(root: pathlib.Path) -> list[int]:
    """The node count of the cluster under ``root`` (none when there is no cluster)."""
    try:
        state = msgspec.json.decode((pathlib.Path(root).resolve() / "kafka-cluster" /
                                     "cluster.json").read_bytes(), type=ClusterState)
    except (OSError, msgspec.DecodeError):
        return []
    return [len(state.ports)]


class KafkaCluster:
    def __init__(self, root: pathlib.Path, brokers: int = 3):
        self.root = pathlib.Path(root).resolve()
        self.folder = self.root / "kafka-cluster"
        self.statefile = self.folder / "cluster.json"
        self.brokers = brokers
        self.cache = self.root / "cache"
        self.state = self._load() or self._new_state()
        self.nodes = [Node(self.root, i, self.state, self.cache) for i in range(brokers)]

    def _load(self) -> ClusterState | None:
        try:
            state = msgspec.json.decode(self.statefile.read_bytes(), type=ClusterState)
        except (OSError, msgspec.DecodeError):
            return None
        return state if len(state.ports) == self.brokers else None

    def _new_state(self) -> ClusterState:
        taken: set[int] = set()
        ports = []
        for _ in range(self.brokers):
            port = pick_port("auto", 19092, what="Kafka broker", flag="--kafka-port", taken=taken)
            taken.add(port)
            ctl = pick_port("auto", port + 1, what="Kafka controller", flag="--kafka-port",
                            taken=taken)
            taken.add(ctl)
            ports.append((port, ctl))
        return ClusterState(cluster_id=cluster_id(), ports=ports)

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def up(self, timeout: float = 180) -> str:
        """Start the nodes that do not run and wait until every node is registered."""
        with locked(self.folder):
            return self._up(timeout)

    def _up(self, timeout: float) -> str:
        if all(node.pid() is None for node in self.nodes) and not all(
                port_free(p) for pair in self.state.ports for p in pair):
            # stopped, and another process took a remembered port: new ports, new storage
            self.state = self._new_state()
            self.nodes = [Node(self.root, i, self.state, self.cache)
                          for i in range(self.brokers)]
        write_atomic(self.statefile, msgspec.json.encode(self.state))
        jars = self._init_nodes()
        for node in self.nodes:
            if node.pid() is None:
                node.start(jars)
        for node in self.nodes:
            wait_until(node.ready, timeout=timeout, what=f"Kafka node {node.node_id} on port "
                       f"{node.port}", log=node.log, alive=lambda n=node: n.pid() is not None)
        return self.bootstrap

    def _init_nodes(self) -> pathlib.Path:
        """Format the nodes' storage side by side (each format is a JVM of its own, a few
        seconds apart from the others); the jars are fetched once before."""
        from concurrent.futures import ThreadPoolExecutor

        from actors.services import maven

        jars = maven.fetch("kafka", self.cache)
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            for done in [pool.submit(node.init) for node in self.nodes]:
                done.result()
        return jars

    def start(self, node_id: int, timeout: float = 120) -> None:
        node = self.nodes[node_id - 1]
        if node.pid() is None:
            node.start(node.init())
        wait_until(node.ready, timeout=timeout, what=f"Kafka node {node_id}", log=node.log,
                   alive=lambda: node.pid() is not None)

    def kill9(self, node_id: int) -> None:
        """``kill -9`` one node (a crash: nothing flushed, no controlled shutdown)."""
        node = self.nodes[node_id - 1]
        pid = node.pid()
        if pid is None:
            raise StackError(f"Kafka node {node_id} does not run")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: node.pid() is None, timeout=30, what=f"Kafka node {node_id} to die")

    def leader(self, topic: str, partition: int = 0) -> int:
        """The node id leading ``topic``'s partition (-1 while there is none)."""
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000)
        try:
            for t in admin.describe_topics([topic]):
                for p in t["partitions"]:
                    # kafka-python names them partition/leader or partition_index/leader_id
                    if p.get("partition", p.get("partition_index")) == partition:
                        return p.get("leader", p.get("leader_id", -1))
        finally:
            admin.close()
        return -1

    def down(self) -> list[str]:
        """Stop all nodes at once (one by one, the last would wait for a quorum). A broker's
        controlled shutdown waits for a controller to approve it; once fewer nodes than a
        quorum are left (the others exited first) none can, and they would wait minutes: those
        get ``QUORUMLESS_GRACE`` seconds, then SIGKILL (Kafka recovers their logs on start)."""
        running = [(node, node.pid()) for node in self.nodes if node.pid() is not None]
        for _, pid in running:
            os.kill(pid, signal.SIGTERM)
        quorum = len(self.nodes) // 2 + 1
        deadline = time.monotonic() + 60
        quorumless = None
        while time.monotonic() < deadline:
            alive = [pid for _, pid in running if pid_alive(pid)]
            if not alive:
                break
            if len(alive) < quorum:
                quorumless = quorumless or time.monotonic()
                if time.monotonic() - quorumless > QUORUMLESS_GRACE:
                    break
            time.sleep(0.2)
        for node, pid in running:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
            node.stop()  # waits until it is gone, removes the pid file
        return [f"kafka{node.node_id}" for node, _ in running]
