"""``[source] binary = true`` is refused when the config loads (so by ``check`` and ``run``):
binary tuples would put each type's send() bytes where the text form is documented."""

from __future__ import annotations

import pytest

from router.config.router import parse_config
from router.errors import ConfigError

CONFIG = """
[source]
dsn = "postgresql://x"
slot = "s"
publications = ["p"]
{binary}
[kafka]
bootstrap_servers = "k:9092"
[[routes]]
name = "r"
all_tables = true
"""


def test_binary_mode_is_refused_with_its_key():
    assert parse_config(CONFIG.format(binary="binary = false")).source.binary is False
    with pytest.raises(ConfigError) as exc:
        parse_config(CONFIG.format(binary="binary = true"), source="router.toml")
    message = str(exc.value)
    assert message.startswith("router.toml: source.binary: binary = true is not supported")
    assert "\n" not in message
