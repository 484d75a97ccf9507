"""A Spark standalone cluster on this machine from the pinned pyspark's own distribution: one
master and N workers (``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``)
on free ports, for running the materializer as on a real cluster (``spark://…``).

Rules: ``up`` is idempotent (it reuses a master and workers whose pid files name live
processes) and waits until every worker is registered with the master; ``down`` stops only the
processes this folder's pid files name. Executors run the virtual environment's Python (the
one running this module), so ``--py-files`` bundles import against the same pyspark.

    python -m devstack up --spark-cluster        # or: make spark-cluster
    spark-submit --master spark://127.0.0.1:7077 …
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import urllib.request

from .process import StackError, pick_port, read_pid, spawn, stop_pid, wait_until


def spark_home() -> pathlib.Path:
    import pyspark

    return pathlib.Path(pyspark.__file__).resolve().parent


class SparkCluster:
    """Master + ``workers`` workers of ``cores`` cores and ``memory`` each, state in ``root``."""

    def __init__(self, root: pathlib.Path, *, workers: int = 2, cores: int = 1,
                 memory: str = "1g"):
        self.dir = pathlib.Path(root).resolve() / "spark-cluster"
        self.workers, self.cores, self.memory = workers, cores, memory

    # state ----------------------------------------------------------------------------------

    def _state(self) -> dict | None:
        try:
            return json.loads((self.dir / "cluster.json").read_text())
        except (OSError, ValueError):
            return None

    def _pidfile(self, name: str) -> pathlib.Path:
        return self.dir / f"{name}.pid"

    def _names(self, n: int) -> list[str]:
        return ["master", *(f"worker-{i}" for i in range(1, n + 1))]

    @property
    def master_url(self) -> str | None:
        st = self._state()
        return f"spark://127.0.0.1:{st['master_port']}" if st else None

    def alive_workers(self, web_port: int) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json/", timeout=5) as r:
            body = json.loads(r.read())
        return sum(1 for w in body.get("workers", []) if w.get("state") == "ALIVE")

    def applications(self) -> list[str]:
        """Names of the applications the master has run or runs (its JSON status page)."""
        st = self._state()
        if st is None:
            return []
        with urllib.request.urlopen(f"http://127.0.0.1:{st['webui_port']}/json/",
                                    timeout=5) as r:
            body = json.loads(r.read())
        return [a.get("name", "") for a in [*body.get("activeapps", []),
                                             *body.get("completedapps", [])]]

    # lifecycle ------------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        home = spark_home()
        return {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_LOG_DIR": str(self.dir / "logs"), "SPARK_NO_DAEMONIZE": "1",
                "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}

    def up(self, *, timeout: float = 120.0) -> str:
        """Start what is not running; return the master URL once all workers are registered."""
        self.start()
        return self.wait(timeout=timeout)

    def wait(self, *, timeout: float = 120.0) -> str:
        """The master URL once all workers are registered (after ``start``)."""
        st = self._state()
        if st is None:
            raise StackError(f"no Spark cluster in {self.dir}: start it first")
        url = f"spark://127.0.0.1:{st['master_port']}"
        wait_until(lambda: self.alive_workers(st["webui_port"]) >= self.workers,
                   timeout=timeout, what=f"Spark cluster at {url} ({self.workers} workers)",
                   log=self.dir / "master.log",
                   alive=lambda: read_pid(self._pidfile("master")) is not None)
        return url

    def start(self) -> str:
        """Start what is not running without waiting for it (``wait`` does), so a caller can
        start other things meanwhile; returns the master URL."""
        self.dir.mkdir(parents=True, exist_ok=True)
        st = self._state()
        running = {n: read_pid(self._pidfile(n)) for n in self._names(self.workers)}
        if st is None or running["master"] is None:
            for n, pid in running.items():  # workers of a dead master: start afresh
                if pid is not None:
                    stop_pid(pid)
            port = pick_port("auto", 7077, what="Spark master", flag="--spark-cluster")
            web = pick_port("auto", 8080, what="Spark master web UI", flag="--spark-cluster",
                            taken={port})
            st = {"master_port": port, "webui_port": web, "workers": self.workers}
            (self.dir / "cluster.json").write_text(json.dumps(st))
            running = dict.fromkeys(running)
        spark_class = str(spark_home() / "bin" / "spark-class")
        env = self._env()
        if running["master"] is None:
            pid = spawn([spark_class, "org.apache.spark.deploy.master.Master",
                         "--host", "127.0.0.1", "--port", str(st["master_port"]),
                         "--webui-port", str(st["webui_port"])],
                        log=self.dir / "master.log", cwd=self.dir, env=env)
            self._pidfile("master").write_text(str(pid))
        url = f"spark://127.0.0.1:{st['master_port']}"
        for name in self._names(self.workers)[1:]:
            if running[name] is None:
                work = self.dir / name
                work.mkdir(exist_ok=True)
                # port 0 / web UI port 0: the OS picks free ones, nothing to collide with
                pid = spawn([spark_class, "org.apache.spark.deploy.worker.Worker",
                             "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                             "--cores", str(self.cores), "--memory", self.memory,
                             "--work-dir", str(work), url],
                            log=self.dir / f"{name}.log", cwd=work, env=env)
                self._pidfile(name).write_text(str(pid))
        return url

    def down(self) -> list[str]:
        stopped = []
        st = self._state()
        for name in reversed(self._names(st["workers"] if st else self.workers)):
            pid = read_pid(self._pidfile(name))
            if pid is not None:
                stop_pid(pid)
                stopped.append(f"spark {name}")
            self._pidfile(name).unlink(missing_ok=True)
        return stopped

    def running(self) -> bool:
        return read_pid(self._pidfile("master")) is not None

