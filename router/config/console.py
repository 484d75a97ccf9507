"""``[console]``: the operator console served on the metrics listener (``/``, ``/api/status``),
and the configuration summary it shows with every secret taken out.

Rules:

* The page and ``/api/status`` live on ``[metrics] listen`` (nothing new to start); the
  listener binds only where ``listen`` says (``127.0.0.1:9187`` in the examples).
* With ``token`` (``Authorization: Bearer …``) or ``username``/``password`` (HTTP basic)
  every path but ``/healthz`` and ``/readyz`` needs them; ``tls_cert``/``tls_key`` serve it
  over HTTPS. The page is read-only unless ``allow_actions = true``, which needs one of the
  two credentials (the backfill button then also needs the page's CSRF token).
* ``redacted``: what the page shows of a config. A value under a key that names a secret
  (``password``, ``secret``, ``token``, the Kafka settings in ``SECRETS``) becomes ``"***"``,
  a DSN or URL keeps everything but its password. Nothing secret reaches the page or JSON.
"""

from __future__ import annotations

import re

import msgspec

from ..postgres import dsn as dsns
from ..errors import ConfigError


class ConsoleConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    #: serve the console page at ``/`` and its JSON at ``/api/status`` on ``[metrics] listen``
    enabled: bool = True
    #: bearer token every request but /healthz and /readyz must carry
    #: (``Authorization: Bearer <token>``); "" = none
    token: str = ""
    #: HTTP basic auth (what a browser prompts for); both or neither
    username: str = ""
    password: str = ""
    #: PEM certificate chain and private key: the listener speaks HTTPS
    tls_cert: str = ""
    tls_key: str = ""
    #: the page may start a backfill of a route (needs token or username/password)
    allow_actions: bool = False


#: key names whose values are secrets wherever they appear in a config
_SECRET_KEY = re.compile(r"password|secret|token|sasl_plain_password|ssl_password", re.I)
#: ``scheme://user:secret@host`` in any URL
_URL_SECRET = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/@:\s]*:)[^@/\s]*@", re.I)
MASK = "***"


def validate_console(c: ConsoleConfig, *, source: str, prefix: str = "console") -> None:
    if bool(c.username) != bool(c.password):
        raise ConfigError("give both username and password (HTTP basic auth) or neither",
                          path=f"{prefix}.{'password' if c.username else 'username'}",
                          source=source)
    if bool(c.tls_cert) != bool(c.tls_key):
        raise ConfigError("give both tls_cert and tls_key or neither",
                          path=f"{prefix}.{'tls_key' if c.tls_cert else 'tls_cert'}",
                          source=source)
    if c.allow_actions and not (c.token or c.username):
        raise ConfigError("allow_actions = true needs token or username/password: actions "
                          "are never open to anyone who reaches the port",
                          path=f"{prefix}.allow_actions", source=source)


def redacted(cfg) -> dict:
    """``cfg`` (any config Struct) as plain data without a secret in it."""
    return _clean(msgspec.to_builtins(cfg), "")


def _clean(value, key: str):
    if isinstance(value, dict):
        return {k: _clean(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v, key) for v in value]
    if isinstance(value, str):
        if _SECRET_KEY.search(key):
            return MASK if value else ""
        if key == "dsn" or key.endswith("_dsn"):
            return dsns.mask(value)
        return _URL_SECRET.sub(lambda m: m.group("head") + MASK + "@", value)
    return value
