"""``pgrouter console``: one page over several routers' ``/api/status`` (the "all pipelines"
view). Each request for ``/api/routers`` asks every router at once (one thread each, a short
timeout) and relays what they answered, or why not; the overview never writes to a router.

Rules: what is relayed is the router's own (secret-free) document without its CSRF token and
configuration; a router that does not answer, answers 401, redirects or answers something that
is not a status document is shown as such, never as healthy. The token goes only to the URL
named with ``--router``: a redirect is never followed (it would carry the token to whatever
host the answer names), it is the router's error; nor is ``http_proxy`` from the environment
used (a proxy would read the token of a plain-HTTP router).
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.error
import urllib.parse
import urllib.request

from .web import asset, respond, send_json

#: seconds one router may take to answer
TIMEOUT = 3.0
#: bytes of one router's answer read at most (a status document is far smaller)
MAX_BODY = 16 * 1024 * 1024


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx stays an answer (``HTTPError``): following it would send the token elsewhere."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


#: no proxy from the environment either: an ``http://`` router's token would pass through it
_OPENER = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))


def _shown(location: str | None) -> str:
    """Where a redirect pointed, without credentials or query (the log and page show it)."""
    try:
        parts = urllib.parse.urlsplit(location or "")
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port out of range, a bad IPv6 literal: the router's error
        return "an invalid URL"
    return f"{parts.scheme}://{host}{port}{parts.path}" if host else (parts.path or "?")


def _body(resp, deadline: float, timeout: float) -> bytes:
    """The answer, at most ``MAX_BODY`` bytes and until ``deadline`` (a read blocks at most
    ``timeout`` more): a router dripping or streaming without end must not hold the
    overview's page, nor fill its memory."""
    out = bytearray()
    while True:
        if time.monotonic() > deadline:
            raise ValueError(f"did not answer within {timeout:g} s")
        chunk = resp.read1(64 * 1024)
        if not chunk:
            return bytes(out)
        out += chunk
        if len(out) > MAX_BODY:
            raise ValueError(f"an answer larger than {MAX_BODY // (1024 * 1024)} MiB is not "
                             "a status document")


def _http_error(exc: urllib.error.HTTPError) -> str:
    if 300 <= exc.code < 400:
        return (f"HTTP {exc.code}: redirects to {_shown(exc.headers.get('Location'))} "
                "(not followed: the token goes only to the router named)")
    return f"HTTP {exc.code}" + (" (credentials refused)" if exc.code == 401 else "")


def fetch(url: str, token: str = "", timeout: float = TIMEOUT) -> dict:
    req = urllib.request.Request(url.rstrip("/") + "/api/status",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    out: dict = {"url": url, "ok": False, "error": None, "status": None}
    deadline = time.monotonic() + timeout
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            doc = json.loads(_body(resp, deadline, timeout))
        if not isinstance(doc, dict) or "schema" not in doc:
            raise ValueError("not a pgrouter status document")
    except urllib.error.HTTPError as exc:
        out["error"] = _http_error(exc)
        return out
    except (OSError, ValueError) as exc:
        out["error"] = str(getattr(exc, "reason", None) or exc)
        return out
    doc.pop("csrf", None)
    doc.pop("config", None)
    out.update(ok=True, status=doc)
    return out


class Overview:
    """The overview's WSGI app: ``/`` (the page) and ``/api/routers``."""

    def __init__(self, routers: list[str], token: str = ""):
        self.routers = routers
        self.token = token
        self.page = asset("overview.html")
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(routers)))

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path in ("/", "/index.html"):
            return respond(start_response, "200 OK", self.page, "text/html; charset=utf-8")
        if path == "/api/routers":
            answers = list(self._pool.map(lambda u: fetch(u, self.token), self.routers))
            return send_json(start_response, "200 OK", {"routers": answers})
        if path == "/healthz":
            return respond(start_response, "200 OK", b"ok\n", "text/plain; charset=utf-8")
        return respond(start_response, "404 Not Found", b"try / or /api/routers\n",
                       "text/plain; charset=utf-8")
