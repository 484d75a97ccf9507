"""The HTTP endpoint of ``pgrouter run`` / ``pgrouter apply``: ``/metrics`` (Prometheus text
format), ``/healthz`` (the process answers) and ``/readyz`` (the command does its job).

Rules: served from one daemon thread (``wsgiref`` with prometheus_client's WSGI app), so a
scrape never waits for the trio loop and the loop never waits for a scrape; no request is
logged; ``/readyz`` answers 200 only while ``Health.ready`` is set (the pipeline streams and
no failure is pending), 503 with the reason otherwise.
"""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from router.errors import ConfigError


class Health:
    """What ``/readyz`` reports: set by the supervisor, read by the server thread."""

    def __init__(self):
        self._ready = False
        self._reason = "starting"

    def set(self, ready: bool, reason: str) -> None:
        self._ready, self._reason = ready, reason

    def state(self) -> tuple[bool, str]:
        return self._ready, self._reason


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def _server_class(host: str):
    return _Server6 if ":" in host else _Server


def _cannot(host: str, port: int, exc: OSError) -> ConfigError:
    shown = f"[{host}]" if ":" in host else host
    why = exc.strerror or str(exc)
    if isinstance(exc, socket.gaierror):
        why = f"host not found ({why})"
    return ConfigError(f"cannot listen on {shown}:{port}: {why}", path="metrics.listen")


def probe(host: str, port: int) -> None:
    """Bind ``host:port`` as the endpoint will and let it go: ``ConfigError`` when the address
    is taken, not on this machine or not found (what ``pgrouter check`` says before ``run``)."""
    try:
        server = _server_class(host)((host, port), WSGIRequestHandler, bind_and_activate=False)
        try:
            server.server_bind()
        finally:
            server.server_close()
    except OSError as exc:
        raise _cannot(host, port, exc) from exc


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 — the stdlib's signature
        pass


class Endpoint:
    """A running endpoint; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, host: str, port: int, registry, health: Health):
        metrics_app = make_wsgi_app(registry)

        def app(environ, start_response):
            path = environ.get("PATH_INFO", "")
            if path == "/healthz":
                return _text(start_response, "200 OK", "ok\n")
            if path == "/readyz":
                ready, reason = health.state()
                return _text(start_response, "200 OK" if ready else "503 Service Unavailable",
                             reason + "\n")
            if path in ("/metrics", "/"):
                return metrics_app(environ, start_response)
            return _text(start_response, "404 Not Found", "try /metrics, /healthz, /readyz\n")

        try:
            self._server = make_server(host, port, app, server_class=_server_class(host),
                                       handler_class=_QuietHandler)
        except OSError as exc:
            raise _cannot(host, port, exc) from exc
        self.host = host
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="pgrouter-http",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _text(start_response, status: str, body: str):
    data = body.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(data)))])
    return [data]
