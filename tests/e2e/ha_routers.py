"""Several ``pgrouter run`` processes on one ``[ha]`` config, for the high-availability tests:
which one leads (its ``/readyz`` answers 200), faults (``kill -9``, SIGSTOP/SIGCONT), the
slot's holder, and each router's counters from its own ``/metrics``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

from tests.e2e.guarantee import wait_for
from tests.helpers import Pg, kill9, start_router

_URL = re.compile(r"metrics endpoint listening url=(http://[^/]+)/metrics")


class Router:
    def __init__(self, config, log):
        self.log = log
        self.proc: subprocess.Popen = start_router(config, log)
        self.mark = 0  # log offset: lines after it are "since the last fault"
        self._base: str | None = None

    @property
    def base(self) -> str:
        if self._base is None:
            found = wait_for(lambda: _URL.search(self.log.read_text()), timeout=60,
                             what=f"{self.log.name} to listen")
            self._base = found.group(1)
        return self._base

    def text(self, since_mark: bool = False) -> str:
        text = self.log.read_text()
        return text[self.mark:] if since_mark else text

    def set_mark(self) -> None:
        self.mark = len(self.log.read_text())

    def get(self, path: str, timeout: float = 0.5) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:  # frozen or gone
            return 0, ""

    def produced(self) -> float:
        """``pgrouter_records_produced_total`` summed (records handed to Kafka)."""
        status, body = self.get("/metrics", timeout=5)
        assert status == 200, f"{self.log.name}: /metrics answered {status}"
        return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
                   if line.startswith("pgrouter_records_produced_total"))

    def signal(self, sig) -> None:
        os.killpg(self.proc.pid, sig)


class Group:
    def __init__(self, config, tmp, dsn: str, slot: str, n: int = 3):
        self.config, self.tmp, self.dsn, self.slot = config, tmp, dsn, slot
        self.pg = Pg(dsn)
        self.started = 0
        self.routers = [self._new() for _ in range(n)]

    def _new(self) -> Router:
        self.started += 1
        return Router(self.config, self.tmp / f"router-{self.started}.log")

    def holder(self) -> int | None:
        return self.pg.one("select active_pid from pg_replication_slots where slot_name = %s",
                           self.slot) if self.pg.run(
            "select 1 from pg_replication_slots where slot_name = %s", self.slot) else None

    def leader(self, timeout: float = 60) -> int:
        """Index of the router whose /readyz says it streams (exactly one may)."""
        def find():
            ready = [i for i, r in enumerate(self.routers)
                     if r.proc.poll() is None and r.get("/readyz")[0] == 200]
            assert len(ready) <= 1, f"two routers report streaming: {ready}"
            return ready[0] + 1 if ready else None
        return wait_for(find, timeout=timeout, what="a leader") - 1

    def taken_over(self, old_pid: int | None, start: float, timeout: float = 60) -> float:
        """Seconds from ``start`` until the slot is held by a walsender other than
        ``old_pid`` (another router streams)."""
        wait_for(lambda: self.holder() not in (None, old_pid), timeout=timeout,
                 what="another router to take the slot", interval=0.05)
        return time.time() - start

    def replace(self, i: int) -> None:
        """A router that died is started again (what systemd/Kubernetes would do)."""
        self.routers[i] = self._new()

    def kill9(self, i: int) -> None:
        kill9(self.routers[i].proc)

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM every router (the leader drains); each must exit 0."""
        for r in self.routers:  # a router started a moment ago handles signals once it joins
            wait_for(lambda: r.proc.poll() is not None or "joining the leadership group"
                     in r.text(), timeout=60, what=f"{r.log.name} to start")
        for r in self.routers:
            if r.proc.poll() is None:
                r.signal(signal.SIGCONT)
                r.proc.terminate()
        for r in self.routers:
            try:
                r.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill9(r.proc)
                raise AssertionError(f"{r.log.name} did not stop:\n{r.text()[-3000:]}")
        for r in self.routers:
            assert r.proc.returncode == 0, f"{r.log.name}:\n{r.text()[-3000:]}"
            assert "Traceback" not in r.text(), r.text()[-3000:]
        self.pg.close()

    def kill_all(self) -> None:
        for r in self.routers:
            kill9(r.proc)
