"""The HTTP endpoint of ``pgrouter run`` / ``pgrouter apply``: ``/metrics`` (Prometheus text
format), ``/healthz`` (the process answers), ``/readyz`` (the command does its job) and the
operator console (``/`` and ``/api/…``, ``actors.console.web``).

Rules: served from one daemon thread (``wsgiref`` with prometheus_client's WSGI app), so a
scrape never waits for the trio loop and the loop never waits for a scrape; no request is
logged; ``/readyz`` answers 200 only while ``Health.ready`` is set (the pipeline streams and
no failure is pending), 503 with the reason otherwise. With ``[console]`` credentials every
path but ``/healthz`` and ``/readyz`` needs them; with ``tls_cert``/``tls_key`` the listener
speaks only HTTPS (the handshake runs on the request's thread, not the accepting one).
"""

from __future__ import annotations

import functools
import socket
import ssl
import threading
import time

from router.config.console import ConsoleConfig
from router.errors import ConfigError

from ..console.web import Console, authorized, refuse


class Health:
    """What ``/readyz`` reports: set by the supervisor, read by the server thread."""

    def __init__(self):
        self._ready = False
        self._reason = "starting"
        #: when ``ready`` last changed (Unix time): the console's current problem is what
        #: was logged since the command stopped being ready
        self.changed_at = time.time()

    def set(self, ready: bool, reason: str) -> None:
        if ready != self._ready:
            self.changed_at = time.time()
        self._ready, self._reason = ready, reason

    def state(self) -> tuple[bool, str]:
        return self._ready, self._reason


@functools.cache
def _wsgi():
    """wsgiref's server classes, made on first use: a command without an endpoint never
    imports wsgiref (nor prometheus_client, whose exposition imports it), which costs a
    start tens of milliseconds. Returns (server of IPv4, of IPv6, quiet handler, make_server)."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        allow_reuse_address = True

        def handle_error(self, request, client_address):
            """A client that went away or failed its TLS handshake: nothing to report."""

    class Server6(Server):
        address_family = socket.AF_INET6

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 — the stdlib's signature
            pass

    return Server, Server6, QuietHandler, make_server


def _serve(host: str, port: int, app):
    server, server6, quiet, make_server = _wsgi()
    return make_server(host, port, app, server_class=server6 if ":" in host else server,
                       handler_class=quiet)


def listener(host: str, port: int, app, *, path: str):
    """A wsgiref server of ``app`` bound to ``host:port`` (quiet, a thread per request), or
    ``ConfigError`` at ``path`` saying why not (``pgrouter console``)."""
    try:
        return _serve(host, port, app)
    except OSError as exc:
        raise ConfigError(str(_cannot(host, port, exc)).removeprefix("metrics.listen: "),
                          path=path) from exc


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
        server_class, server6, handler, _ = _wsgi()
        server = (server6 if ":" in host else server_class)((host, port), handler,
                                                            bind_and_activate=False)
        try:
            server.server_bind()
        finally:
            server.server_close()
    except OSError as exc:
        raise _cannot(host, port, exc) from exc


class Endpoint:
    """A running endpoint; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, host: str, port: int, registry, health: Health, *,
                 console: Console | None = None, cfg: ConsoleConfig | None = None):
        from prometheus_client import make_wsgi_app

        metrics_app = make_wsgi_app(registry)
        cfg = cfg or ConsoleConfig()

        def app(environ, start_response):
            path = environ.get("PATH_INFO", "")
            if path == "/healthz":
                return _text(start_response, "200 OK", "ok\n")
            if path == "/readyz":
                ready, reason = health.state()
                return _text(start_response, "200 OK" if ready else "503 Service Unavailable",
                             reason + "\n")
            if not authorized(environ, cfg):
                return refuse(start_response, cfg)
            if console is not None:
                answer = console(environ, start_response)
                if answer is not None:
                    return answer
            if path in ("/metrics", "/"):
                return metrics_app(environ, start_response)
            return _text(start_response, "404 Not Found",
                         "try /, /api/status, /metrics, /healthz, /readyz\n")

        tls = _tls(cfg) if cfg.tls_cert else None  # unreadable files: before binding
        try:
            self._server = _serve(host, port, app)
        except OSError as exc:
            raise _cannot(host, port, exc) from exc
        if tls is not None:
            self._server.socket = tls.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False)
        self.scheme = "https" if cfg.tls_cert else "http"
        self.host = host
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="pgrouter-http",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _tls(cfg: ConsoleConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the certificate and key: {exc}",
                          path="console.tls_cert") from exc
    return ctx


def _text(start_response, status: str, body: str):
    data = body.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(data)))])
    return [data]
