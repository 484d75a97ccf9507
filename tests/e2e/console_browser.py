"""What the console's browser tests share: HTTP with the console's token, waiting, stopping a
command, and a headless chromium (Debian's ``chromium`` and ``chromedriver``, driven by
Selenium; the ``browser`` fixture is in ``tests/e2e/conftest.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

from tests.helpers import kill9

TOKEN = "console-token-6f1d"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, token: str | None = TOKEN) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def wait_for(check, what: str, timeout: float = 60, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            kill9(proc)


def chromium():
    """A headless chromium; ``quit()`` it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1400"):
        opts.add_argument(arg)
    # Debian's chromedriver, named: Selenium Manager must not try to download one
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    driver.execute_cdp_cmd("Network.enable", {})
    return driver


def with_token(driver, token: str | None) -> None:
    """Every request of the browser (the page and its fetches) carries the token."""
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {
        "headers": {"Authorization": f"Bearer {token}"} if token else {}})
