"""A TCP forwarder the test can close and open again on the same port: "Kafka unreachable"
for one router (its bootstrap address) without touching the shared broker. Closed, the port
refuses connections and the connections it carried are cut; opened, it forwards again.
``rate`` (bytes/s) caps what each connection forwards from the server to the client: a slow
link (a table that takes seconds to read)."""

from __future__ import annotations

import socket
import threading
import time


class PausableProxy:
    def __init__(self, target: tuple[str, int], *, start_open: bool = True,
                 rate: int | None = None):
        self.target = target
        self.rate = rate
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        if start_open:
            self.open()

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, server]
            for a, b, rate in ((client, server, None), (server, client, self.rate)):
                threading.Thread(target=_pipe, args=(a, b, rate), daemon=True).start()


def _pipe(src: socket.socket, dst: socket.socket, rate: int | None = None) -> None:
    try:
        while data := src.recv(65536 if rate is None else max(1, rate // 50)):
            dst.sendall(data)
            if rate is not None:
                time.sleep(len(data) / rate)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
