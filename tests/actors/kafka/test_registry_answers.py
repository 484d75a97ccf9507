"""The schema registry client against HTTP answers a misconfigured ``[kafka.registry] url``
gets: a redirect to a login page on another host (the registry's credentials must not
follow it), and 200 JSON that is not a list of subjects. Real local HTTP servers."""

from __future__ import annotations

import json

import pytest

from actors.kafka.registry import RegistryClient, RegistryRejected
from router.config.router import RegistryConfig
from tests.actors.console.test_overview_redirect import _server
from tests.http_kit import answer

PASSWORD = "reg-s3cret"


@pytest.fixture
def servers():
    made = []

    def start(handle):
        made.append(_server(handle))
        return made[-1].server_address[1]

    yield start
    for s in made:
        s.shutdown()
        s.server_close()


def test_a_redirect_to_a_login_page_keeps_the_credentials_home(servers):
    seen: list[dict] = []

    def login(req):
        seen.append(dict(req.headers))
        answer(req, 200, b"<html><title>Sign in</title></html>", "text/html")

    # "localhost" rather than 127.0.0.1: another host as far as a URL's origin goes
    sso = f"http://localhost:{servers(login)}/login?next=/subjects"
    port = servers(lambda req: answer(req, 302, b"", "text/plain", Location=sso))
    client = RegistryClient(RegistryConfig(url=f"http://127.0.0.1:{port}/apis/ccompat/v7",
                                           username="u", password=PASSWORD))
    with pytest.raises(RegistryRejected) as info:
        client.ping()
    assert seen == [], seen  # not asked at all: the credentials go only to the url configured
    line = str(info.value)
    assert "302" in line and f"http://localhost:{sso.split(':')[2].split('/')[0]}/login" in line
    assert PASSWORD not in line and "next=" not in line and "\n" not in line, line


@pytest.mark.parametrize("body", [b'{"subjects": []}', b'"subjects"', b"null"])
def test_200_json_that_is_not_a_list_fails_the_ping(servers, body):
    port = servers(lambda req: answer(req, 200, body, "application/json"))
    client = RegistryClient(RegistryConfig(url=f"http://127.0.0.1:{port}"))
    with pytest.raises(RegistryRejected) as info:
        client.ping()
    assert "answered 200" in str(info.value) and "not a list of subjects" in str(info.value)
    assert json.loads(body) is None or type(json.loads(body)).__name__ in str(info.value)
