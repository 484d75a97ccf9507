"""The console's HTTP side on a real listener (``services.http.Endpoint``): credentials on
every path but the probes, the CSRF rule of the backfill action, HTTPS with a certificate,
and the board's bounds (the last 100 warnings, an hour of lag)."""

from __future__ import annotations

import base64
import http.client
import json
import logging
import ssl
import urllib.error
import urllib.request

import pytest
import trustme
from prometheus_client import CollectorRegistry

from actors.console import board
from actors.console.web import Console
from actors.services.http import Endpoint, Health
from router.config.console import ConsoleConfig


def get(url: str, headers=None, data=None, context=None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(req, timeout=5, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def serve(cfg: ConsoleConfig, backfill=None) -> Endpoint:
    health = Health()
    console = Console(cfg, lambda: {"schema": 1, "kind": "run"}, backfill)
    return Endpoint("127.0.0.1", 0, CollectorRegistry(), health, console=console, cfg=cfg)


@pytest.fixture
def endpoint():
    made = []

    def make(cfg, backfill=None):
        made.append(serve(cfg, backfill))
        return f"http://127.0.0.1:{made[-1].port}"
    yield make
    for e in made:
        e.close()


def test_bearer_and_basic_credentials_guard_everything_but_the_probes(endpoint):
    base = endpoint(ConsoleConfig(token="t0k", username="op", password="pw"))
    basic = "Basic " + base64.b64encode(b"op:pw").decode()
    for path in ("/", "/api/status", "/metrics"):
        assert get(base + path)[0] == 401, path
        assert get(base + path, {"Authorization": "Bearer wrong"})[0] == 401, path
        assert get(base + path, {"Authorization": "Basic " + base64.b64encode(
            b"op:nope").decode()})[0] == 401, path
        assert get(base + path, {"Authorization": "Bearer t0k"})[0] == 200, path
        assert get(base + path, {"Authorization": basic})[0] == 200, path
    for path in ("/healthz", "/readyz"):
        assert get(base + path)[0] in (200, 503), path
    status, body = get(base + "/", {"Authorization": "Bearer t0k"})
    assert b"<!doctype html>" in body and b"t0k" not in body
    assert b"http://" not in body and b"https://" not in body  # no external asset


def test_without_console_slash_is_still_the_metrics(endpoint):
    base = endpoint(ConsoleConfig(enabled=False))
    assert get(base + "/api/status")[0] == 404
    assert b"# HELP" in get(base + "/")[1] or get(base + "/")[0] == 200


def test_the_backfill_action_needs_the_csrf_token_and_same_origin(endpoint):
    asked = []

    def backfill(routes, tables):
        asked.append((routes, tables))
        return "rid1", [], []
    base = endpoint(ConsoleConfig(token="t0k", allow_actions=True), backfill)
    auth = {"Authorization": "Bearer t0k"}
    doc = json.loads(get(base + "/api/status", auth)[1])
    assert doc["actions"] == {"backfill": True} and doc["csrf"]
    body = json.dumps({"routes": ["r"], "tables": ["public.t"]}).encode()
    post = {**auth, "Content-Type": "application/json"}
    assert get(base + "/api/backfill", {"Content-Type": "application/json"}, body)[0] == 401
    assert get(base + "/api/backfill", post, body)[0] == 403  # no CSRF token
    assert get(base + "/api/backfill", {**post, "X-CSRF-Token": "guess"}, body)[0] == 403
    assert get(base + "/api/backfill", {**post, "X-CSRF-Token": doc["csrf"],
                                        "Origin": "http://evil.example"}, body)[0] == 403
    assert get(base + "/api/backfill", {**post, "X-CSRF-Token": doc["csrf"]}, b"{}")[0] == 400
    assert asked == []
    status, answer = get(base + "/api/backfill", {**post, "X-CSRF-Token": doc["csrf"]}, body)
    assert status == 200 and json.loads(answer)["request"] == "rid1"
    assert asked == [(["r"], ["public.t"])]


def test_read_only_by_default(endpoint):
    base = endpoint(ConsoleConfig(), lambda r, t: ("x", [], []))
    doc = json.loads(get(base + "/api/status")[1])
    assert doc["actions"] == {"backfill": False} and "csrf" not in doc
    assert get(base + "/api/backfill", {"Content-Type": "application/json"},
               b'{"routes": ["r"]}')[0] == 403


def test_https_with_a_certificate(endpoint, tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    base = endpoint(ConsoleConfig(tls_cert=str(tmp_path / "server.pem"),
                                  tls_key=str(tmp_path / "server.pem"), token="t")).replace(
        "http://", "https://")
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    assert get(base + "/api/status", {"Authorization": "Bearer t"}, context=ctx)[0] == 200
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, OSError)):
        # plain HTTP is not answered
        urllib.request.urlopen(base.replace("https://", "http://") + "/healthz", timeout=3)


def test_the_board_keeps_the_last_hundred_problems_and_an_hour_of_lag():
    ring = board.RecentProblems()
    logger = logging.getLogger("pgrouter.test_console")
    logger.addHandler(ring)
    try:
        for i in range(150):
            logger.warning("w%d", i, extra={"fields": {"n": i, "obj": object()}})
        logger.info("not kept")
    finally:
        logger.removeHandler(ring)
    lines = ring.snapshot()
    assert len(lines) == 100 and lines[0]["msg"] == "w50" and lines[-1]["msg"] == "w149"
    assert lines[-1]["fields"]["n"] == 149 and isinstance(lines[-1]["fields"]["obj"], str)
    history = board.LagHistory()
    for t in range(0, 7200, 10):
        history.add(t, t / 10, now=1000.0 + t)
    points = history.snapshot()
    assert points[0][0] >= 1000.0 + 7190 - 3600 and points[-1][1] == 7190
    rates = board.Rates()
    assert rates.rate("r", 0, now=0.0) == 0.0
    assert rates.rate("r", 100, now=2.0) == 50.0


def test_the_overview_relays_without_secrets_and_says_why_not(endpoint):
    from actors.console.overview import fetch

    guarded = endpoint(ConsoleConfig(token="t0k", allow_actions=True), lambda r, t: ("", [], []))
    refused = fetch(guarded)
    assert not refused["ok"] and refused["error"] == "HTTP 401 (credentials refused)"
    relayed = fetch(guarded, "t0k")
    assert relayed["ok"] and relayed["status"]["kind"] == "run"
    assert "csrf" not in relayed["status"] and "config" not in relayed["status"]
    nobody = fetch("http://127.0.0.1:1", timeout=2)
    assert not nobody["ok"] and nobody["error"]
    metrics_only = fetch(endpoint(ConsoleConfig(enabled=False)))
    assert not metrics_only["ok"] and metrics_only["error"] == "HTTP 404"
