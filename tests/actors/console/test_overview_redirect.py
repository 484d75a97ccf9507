"""``pgrouter console --token-file`` against a router that answers ``302`` to another host:
the token never reaches that host, and the router is shown unhealthy with the reason. Real
local HTTP servers and the real CLI; the second server records every request it gets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers import ROOT
from tests.http_kit import send_head

TOKEN = "s3cret-t0ken"
#: what a router answers: a status document (the overview would show it healthy)
DOC = json.dumps({"schema": 1, "kind": "run", "name": "elsewhere",
                  "state": {"ready": True, "reason": "streaming"}}).encode()


def _server(handle) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 — the stdlib's name
            handle(self)

        def log_message(self, format, *args):  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def redirecting():
    """(the redirecting router's URL, the requests the other host received)."""
    seen: list[dict] = []

    def elsewhere(req):
        seen.append({"path": req.path, "headers": dict(req.headers)})
        req.send_response(200)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(DOC)))
        req.end_headers()
        req.wfile.write(DOC)

    other = _server(elsewhere)
    # "localhost" rather than 127.0.0.1: another host as far as a URL's origin goes
    target = f"http://localhost:{other.server_address[1]}/api/status?token=leaked"

    def router(req):
        req.send_response(302)
        req.send_header("Location", target)
        req.send_header("Content-Length", "0")
        req.end_headers()

    first = _server(router)
    yield f"http://127.0.0.1:{first.server_address[1]}", seen
    for s in (first, other):
        s.shutdown()
        s.server_close()


def _routers(proc: subprocess.Popen, deadline: float) -> dict:
    """The overview's /api/routers once it listens (its URL is in its start line)."""
    line = ""
    while "console listening" not in line:
        assert time.monotonic() < deadline, "the overview did not start"
        line = proc.stderr.readline()
        assert line or proc.poll() is None, "the overview exited"
    url = re.search(r"url=(\S+)", line).group(1).rstrip("/")
    with urllib.request.urlopen(url + "/api/routers", timeout=10) as resp:
        return json.loads(resp.read())


def test_a_redirect_is_not_followed_and_the_token_stays_home(redirecting, tmp_path):
    url, seen = redirecting
    (tmp_path / "token").write_text(TOKEN + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "actors.cli", "console", "--router", url,
                             "--token-file", str(tmp_path / "token"),
                             "--listen", "127.0.0.1:0"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        answers = _routers(proc, time.monotonic() + 30)["routers"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert not any(TOKEN in json.dumps(r["headers"]) for r in seen), seen
    assert seen == []  # not even asked without the token: a redirect is the router's error
    (router,) = answers
    assert router["url"] == url and router["ok"] is False and router["status"] is None
    # the page names where the redirect pointed, without its query
    assert router["error"].startswith("HTTP 302: redirects to http://localhost:"), router
    assert "/api/status" in router["error"] and "leaked" not in router["error"]


def test_a_proxy_from_the_environment_never_sees_the_token(tmp_path):
    """``http_proxy`` in the overview's environment: a plain-HTTP router's token would pass
    through the proxy in clear, so the overview asks the router directly."""
    proxied: list[dict] = []

    def proxy(req):
        proxied.append({"path": req.path, "headers": dict(req.headers)})
        send_head(req, 502, 0)

    def router(req):
        send_head(req, 200, len(DOC), "application/json")
        req.wfile.write(DOC)

    servers = [_server(proxy), _server(router)]
    proxy_url = f"http://127.0.0.1:{servers[0].server_address[1]}"
    url = f"http://127.0.0.1:{servers[1].server_address[1]}"
    (tmp_path / "token").write_text(TOKEN + "\n")
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(http_proxy=proxy_url, HTTP_PROXY=proxy_url)
    proc = subprocess.Popen([sys.executable, "-m", "actors.cli", "console", "--router", url,
                             "--token-file", str(tmp_path / "token"),
                             "--listen", "127.0.0.1:0"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True, env=env)
    try:
        # the overview's own page is asked for directly too (urllib in this process has no proxy)
        answers = _routers(proc, time.monotonic() + 30)["routers"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for s in servers:
            s.shutdown()
            s.server_close()
    assert proxied == []
    (answer,) = answers
    assert answer["ok"] is True, answer
