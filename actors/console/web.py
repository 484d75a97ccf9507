"""The console's HTTP side, as WSGI pieces the metrics listener mounts: credentials, the page
(``/``), its JSON (``/api/status``) and the optional backfill action (``POST /api/backfill``).

Rules:

* ``authorized``: with ``[console] token`` a request carries ``Authorization: Bearer <token>``;
  with ``username``/``password`` HTTP basic credentials; either is enough when both are set.
  Compared in constant time. Without either every request is let in (the listener is meant to
  bind 127.0.0.1 then). A refusal is 401 with a ``WWW-Authenticate`` challenge and no body
  worth reading.
* The page is one file of package data (``page.html``, inline CSS and JS, no external asset),
  read once. ``/api/status`` calls the command's status function on the HTTP thread: it reads
  what the actors published and never waits for the trio loop.
* ``POST /api/backfill`` only with ``allow_actions``, credentials, a JSON body, the CSRF token
  the page got from ``/api/status`` in ``X-CSRF-Token`` and, when the browser sends one, an
  ``Origin`` naming this host. The request itself runs on the request's thread (its own SQL
  connection), never on the trio loop.
"""

from __future__ import annotations

import base64
import hmac
import importlib.resources
import json
import secrets
from typing import Callable

from router.config.console import ConsoleConfig

JSON = "application/json"
#: largest POST body read
MAX_BODY = 64 * 1024


def asset(name: str) -> bytes:
    return importlib.resources.files("actors.console").joinpath(name).read_bytes()


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def authorized(environ: dict, cfg: ConsoleConfig) -> bool:
    if not (cfg.token or cfg.username):
        return True
    header = environ.get("HTTP_AUTHORIZATION", "")
    scheme, _, value = header.partition(" ")
    if cfg.token and scheme.lower() == "bearer" and _same(value.strip(), cfg.token):
        return True
    if cfg.username and scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(value.strip()).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return _same(user, cfg.username) & _same(password, cfg.password)
    return False


def refuse(start_response, cfg: ConsoleConfig):
    challenge = 'Basic realm="pgrouter"' if cfg.username else 'Bearer realm="pgrouter"'
    return respond(start_response, "401 Unauthorized", b"credentials needed\n",
                   "text/plain; charset=utf-8", [("WWW-Authenticate", challenge)])


def respond(start_response, status: str, body: bytes, ctype: str, extra=()):
    start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body))),
                            ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
                            ("X-Frame-Options", "DENY"),
                            ("Content-Security-Policy",
                             "default-src 'self'; style-src 'unsafe-inline'; "
                             "script-src 'unsafe-inline'; img-src 'self' data:"),
                            *extra])
    return [body]


def send_json(start_response, status: str, doc) -> list[bytes]:
    return respond(start_response, status, json.dumps(doc, default=str).encode(), JSON)


class Console:
    """``/``, ``/api/status`` and ``/api/backfill`` of one command (``run`` or ``apply``);
    ``__call__`` returns None for paths it does not serve."""

    def __init__(self, cfg: ConsoleConfig, status: Callable[[], dict],
                 backfill: Callable[[list[str], list[str]], tuple] | None = None):
        self.cfg = cfg
        self.status = status
        self.backfill = backfill if cfg.allow_actions else None
        self.csrf = secrets.token_urlsafe(32)
        self.page = asset("page.html")

    def __call__(self, environ, start_response):
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        if path in ("/", "/index.html") and self.cfg.enabled:
            return respond(start_response, "200 OK", self.page, "text/html; charset=utf-8")
        if path == "/api/status" and self.cfg.enabled:
            doc = self.status()
            doc["actions"] = {"backfill": self.backfill is not None}
            if self.backfill is not None:
                doc["csrf"] = self.csrf
            return send_json(start_response, "200 OK", doc)
        if path == "/api/backfill" and self.cfg.enabled:
            if method != "POST":
                return send_json(start_response, "405 Method Not Allowed",
                                 {"error": "POST only"})
            return self._backfill(environ, start_response)
        return None

    def _backfill(self, environ, start_response):
        if self.backfill is None:
            return send_json(start_response, "403 Forbidden",
                             {"error": "actions are off ([console] allow_actions)"})
        origin = environ.get("HTTP_ORIGIN")
        if origin and origin.partition("://")[2] != environ.get("HTTP_HOST", ""):
            return send_json(start_response, "403 Forbidden", {"error": "cross-origin request"})
        if not _same(environ.get("HTTP_X_CSRF_TOKEN", ""), self.csrf):
            return send_json(start_response, "403 Forbidden", {"error": "missing CSRF token"})
        try:
            size = int(environ.get("CONTENT_LENGTH") or 0)
            body = json.loads(environ["wsgi.input"].read(min(size, MAX_BODY)) or b"{}")
            routes = body["routes"]
            tables = body.get("tables", [])
            if not (isinstance(routes, list) and routes and isinstance(tables, list)
                    and all(isinstance(x, str) for x in routes + tables)):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return send_json(start_response, "400 Bad Request",
                             {"error": 'expected {"routes": ["R", …], "tables": ["s.t", …]}'})
        rid, planned, problems = self.backfill(routes, tables)
        if problems:
            return send_json(start_response, "400 Bad Request", {"problems": problems})
        return send_json(start_response, "200 OK", {
            "request": rid, "jobs": [{"route": j.route, "table": j.name} for j in planned]})
