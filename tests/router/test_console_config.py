"""``[console]`` and the configuration summary the console shows: every secret a config can
hold is gone from it, everything else is kept."""

from __future__ import annotations

import json

import pytest

from router.config.applier import parse_apply_config
from router.config.router import parse_config
from router.config.console import redacted
from router.errors import ConfigError

SECRETS = ["dsn-pw-1", "sasl-pw-2", "ssl-pw-3", "reg-pw-4", "console-tok-5", "console-pw-6",
           "url-pw-7"]

ROUTER = """
[source]
dsn = "postgresql://app:dsn-pw-1@db.example:5432/app?sslmode=require"
slot = "s"
publications = ["p"]

[kafka]
bootstrap_servers = "k1:9092"
client = "kafka-python"
format = "avro"

[kafka.settings]
security_protocol = "SASL_SSL"
sasl_mechanism = "PLAIN"
sasl_plain_username = "u"
sasl_plain_password = "sasl-pw-2"
ssl_password = "ssl-pw-3"

[kafka.registry]
url = "https://reg:url-pw-7@registry.example/apis/ccompat/v7"
username = "r"
password = "reg-pw-4"

[console]
token = "console-tok-5"
username = "op"
password = "console-pw-6"
allow_actions = true

[[routes]]
name = "r"
tables = ["public.t"]
"""


def test_no_secret_survives_and_the_rest_is_kept():
    cfg = parse_config(ROUTER)
    shown = json.dumps(redacted(cfg))
    for secret in SECRETS:
        assert secret not in shown, secret
    doc = redacted(cfg)
    assert doc["source"]["dsn"] == "postgresql://app:***@db.example:5432/app?sslmode=require"
    assert doc["kafka"]["settings"]["sasl_plain_password"] == "***"
    assert doc["kafka"]["settings"]["sasl_plain_username"] == "u"
    assert doc["kafka"]["registry"]["url"] == "https://reg:***@registry.example/apis/ccompat/v7"
    assert doc["console"] == {**doc["console"], "token": "***", "password": "***",
                              "username": "op"}
    assert doc["routes"][0]["tables"] == ["public.t"]


def test_a_key_value_dsn_and_the_applier_too():
    cfg = parse_apply_config("""
[kafka]
bootstrap_servers = "k:9092"
transactions_topic = "tx"
topics = ["a.*"]
[target]
dsn = "host=b port=5432 dbname=x password='dsn-pw-1'"
origin = "o"
[console]
token = "console-tok-5"
""")
    shown = json.dumps(redacted(cfg))
    assert "dsn-pw-1" not in shown and "console-tok-5" not in shown
    assert "host=b" in shown


@pytest.mark.parametrize("section, path", [
    ('username = "u"', "console.password"),
    ('password = "p"', "console.username"),
    ('tls_cert = "c.pem"', "console.tls_key"),
    ("allow_actions = true", "console.allow_actions"),
])
def test_console_keys_that_do_not_go_together_are_one_line(section, path):
    text = ROUTER.split("[console]")[0] + "[console]\n" + section + """
[[routes]]
name = "r"
tables = ["public.t"]
"""
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert str(err.value).startswith(f"{path}: ") or f" {path}:" in str(err.value), err.value
