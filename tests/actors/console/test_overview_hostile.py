"""The overview against routers (or URLs) a hostile or broken setup gives it: a router URL
holding credentials, a router answering a huge body or dripping it, a redirect to a port no
URL may hold. Each is one line for the user, the overview stays responsive, and nothing
secret is shown. Real local HTTP servers."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from actors.console.overview import MAX_BODY, TIMEOUT, fetch
from tests.actors.console.test_overview_redirect import DOC, _server
from tests.helpers import ROOT
from tests.http_kit import send_head


@pytest.fixture
def router():
    """Start a local server whose GET handler is the function given; stop them after."""
    made = []

    def start(handle):
        made.append(_server(handle))
        return f"http://127.0.0.1:{made[-1].server_address[1]}"

    yield start
    for s in made:
        s.shutdown()
        s.server_close()


@pytest.mark.parametrize("url", ["http://user:pw-s3cret@127.0.0.1:9", "https://:pw-s3cret@h:1",
                                 "http://user@127.0.0.1:9"])
def test_a_router_url_with_credentials_is_refused_without_showing_them(url):
    """The overview would relay the URL to everyone who opens its page, and ask DNS for a
    host named ``user:password@host``."""
    done = subprocess.run([sys.executable, "-m", "actors.cli", "console", "--router", url,
                           "--listen", "127.0.0.1:0"], cwd=ROOT, capture_output=True,
                          text=True, timeout=20)
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "--router[0]" in err[0] and "--token-file" in err[0], err
    assert "pw-s3cret" not in err[0] and "user" not in err[0].split(":", 1)[1], err


def test_a_huge_answer_is_refused_not_read_into_memory(router):
    chunk = b" " * (1 << 20)

    def huge(req):
        req.send_response(200)
        req.send_header("Content-Type", "application/json")
        req.end_headers()
        try:
            for _ in range(4 * MAX_BODY // len(chunk)):
                req.wfile.write(chunk)
        except OSError:
            pass  # the overview hung up, as it should

    started = time.monotonic()
    answer = fetch(router(huge))
    assert answer["ok"] is False and "larger than" in answer["error"], answer
    assert time.monotonic() - started < TIMEOUT + 2


def test_a_router_dripping_its_answer_is_cut_at_the_timeout(router):
    def drip(req):
        send_head(req, 200, len(DOC), "application/json")
        try:
            for b in DOC:  # one byte each 0.3 s: no single read waits the timeout
                req.wfile.write(bytes([b]))
                req.wfile.flush()
                time.sleep(0.3)
        except OSError:
            pass

    started = time.monotonic()
    answer = fetch(router(drip), timeout=1.5)
    assert time.monotonic() - started < 1.5 + 1, answer
    assert answer["ok"] is False and "did not answer within" in answer["error"], answer


def test_a_redirect_to_an_impossible_port_is_the_routers_error(router):
    def bad(req):
        req.send_response(302)
        req.send_header("Location", "http://user:pw-s3cret@elsewhere:99999/x?token=1")
        req.send_header("Content-Length", "0")
        req.end_headers()

    answer = fetch(router(bad), "tok")
    assert answer["ok"] is False and answer["error"].startswith("HTTP 302: redirects to"), answer
    assert "pw-s3cret" not in json.dumps(answer) and "token=1" not in answer["error"]
