"""``[kafka] settings``: one vocabulary for both Kafka clients.

Rules:

* Users write the common names below (kafka-python's spelling, which is also the Java
  client's with ``_`` for ``.``). Each client gets them translated: kafka-python takes them as
  keyword arguments, librdkafka as its dotted configuration properties.
* A key that is not in the table, or not supported by the chosen client, is rejected with
  ``ConfigError(path="kafka.settings.<key>")``, as is a value of the wrong type or outside the
  allowed set. Nothing is passed through unchecked, so a typo never silently falls back to a
  default.
* ``acks``, idempotence, serializers, ``bootstrap_servers`` and transactions are pgrouter's
  (acks=all, idempotent producer) and cannot be set here.
"""

from __future__ import annotations

import re
from typing import Callable

from ..errors import ConfigError

KAFKA_PYTHON = "kafka-python"
LIBRDKAFKA = "librdkafka"

_COMPRESSION = ("none", "gzip", "snappy", "lz4", "zstd")
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")


def _same(value):
    return value


def _hostname_check(value: bool) -> str:
    return "https" if value else "none"


def _kbytes(value: int) -> int:
    return max(1, value // 1024)


class Setting:
    """One common key: its type, allowed values, and each client's name (None: unsupported)
    with an optional value conversion for librdkafka."""

    __slots__ = ("type", "choices", "python", "rdkafka", "to_rdkafka")

    def __init__(self, type_: type, python: str | None, rdkafka: str | None, *,
                 choices: tuple | None = None, to_rdkafka: Callable = _same):
        self.type = type_
        self.choices = choices
        self.python = python
        self.rdkafka = rdkafka
        self.to_rdkafka = to_rdkafka


_SAME = object()  # kafka-python's name is the common key itself


def _both(type_: type, rdkafka: str, **kw) -> Setting:
    return Setting(type_, _SAME, rdkafka, **kw)


#: common key -> Setting
SETTINGS: dict[str, Setting] = {
    "client_id": _both(str, "client.id"),
    "compression_type": _both(str, "compression.type", choices=_COMPRESSION),
    "linger_ms": _both(int, "linger.ms"),
    "batch_size": _both(int, "batch.size"),
    "max_request_size": _both(int, "message.max.bytes"),
    "buffer_memory": _both(int, "queue.buffering.max.kbytes", to_rdkafka=_kbytes),
    "request_timeout_ms": _both(int, "request.timeout.ms"),
    "delivery_timeout_ms": _both(int, "delivery.timeout.ms"),
    # exactly-once: how long one Kafka transaction may stay open (a huge source transaction)
    "transaction_timeout_ms": _both(int, "transaction.timeout.ms"),
    "retry_backoff_ms": _both(int, "retry.backoff.ms"),
    "max_in_flight_requests_per_connection": _both(
        int, "max.in.flight.requests.per.connection"),
    "metadata_max_age_ms": _both(int, "metadata.max.age.ms"),
    "reconnect_backoff_ms": _both(int, "reconnect.backoff.ms"),
    "reconnect_backoff_max_ms": _both(int, "reconnect.backoff.max.ms"),
    "connections_max_idle_ms": _both(int, "connections.max.idle.ms"),
    "security_protocol": _both(str, "security.protocol", choices=_PROTOCOLS),
    "sasl_mechanism": _both(str, "sasl.mechanisms", choices=_MECHANISMS),
    "sasl_plain_username": _both(str, "sasl.username"),
    "sasl_plain_password": _both(str, "sasl.password"),
    "sasl_kerberos_service_name": _both(str, "sasl.kerberos.service.name"),
    "ssl_cafile": _both(str, "ssl.ca.location"),
    "ssl_certfile": _both(str, "ssl.certificate.location"),
    "ssl_keyfile": _both(str, "ssl.key.location"),
    "ssl_password": _both(str, "ssl.key.password"),
    "ssl_check_hostname": _both(bool, "ssl.endpoint.identification.algorithm",
                                to_rdkafka=_hostname_check),
    # librdkafka only: its batching unit has no kafka-python equivalent
    "batch_num_messages": Setting(int, None, "batch.num.messages"),
}
for _key, _s in SETTINGS.items():
    if _s.python is _SAME:
        _s.python = _key

#: set by pgrouter itself; named so the error says why
RESERVED = ("acks", "enable_idempotence", "key_serializer", "value_serializer",
            "bootstrap_servers", "transactional_id", "partitioner")

#: keys whose values are secrets (masked when shown)
SECRETS = frozenset({"sasl_plain_password", "ssl_password"})


def _check(key: str, value, client: str, source: str | None) -> Setting:
    path = f"kafka.settings.{key}"
    if key in RESERVED:
        raise ConfigError("set by pgrouter (acks=all, idempotent producer); remove it",
                          path=path, source=source)
    setting = SETTINGS.get(key)
    if setting is None:
        raise ConfigError(f"unknown Kafka setting; known: {', '.join(sorted(SETTINGS))}",
                          path=path, source=source)
    name = setting.python if client == KAFKA_PYTHON else setting.rdkafka
    if name is None:
        raise ConfigError(f"not supported by the {client} client", path=path, source=source)
    if setting.type is int:
        ok = type(value) is int and value >= 0
    else:
        ok = type(value) is setting.type
    if not ok:
        want = {int: "a non-negative integer", str: "a string", bool: "true or false"}
        raise ConfigError(f"must be {want[setting.type]}, got {value!r}", path=path,
                          source=source)
    if setting.choices is not None and value not in setting.choices:
        raise ConfigError(f"must be one of {', '.join(setting.choices)}, got {value!r}",
                          path=path, source=source)
    return setting


def translate(settings: dict, client: str, *, source: str | None = None) -> dict:
    """The client's own configuration for the common ``settings``; raises ``ConfigError``
    naming the first bad key."""
    if client not in (KAFKA_PYTHON, LIBRDKAFKA):
        raise ConfigError(f"unknown client {client!r}", path="kafka.client", source=source)
    out = {}
    for key, value in settings.items():
        setting = _check(key, value, client, source)
        if client == KAFKA_PYTHON:
            out[setting.python] = value
        else:
            out[setting.rdkafka] = setting.to_rdkafka(value)
    return out


_BROKER = re.compile(r"^(?:[A-Za-z_]+://)?(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._\-]+))"
                     r"(?::(?P<port>[^:]*))?$")


def parse_bootstrap_servers(value: str | list[str], *,
                            path: str = "kafka.bootstrap_servers") -> list[tuple[str, int]]:
    """``"h1:9092,h2:9092"`` or ``["h1:9092", …]`` → ``[(host, port), …]``: what both clients
    accept (``host``, ``host:port``, ``[v6]:port``, an optional ``PROTOCOL://`` prefix; the
    port defaults to 9092). Anything else is a ``ConfigError`` here rather than a client that
    retries an address that can never work."""
    entries = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for entry in entries:
        text = entry.strip()
        m = _BROKER.match(text)
        port = m and m.group("port")
        if not m or (port is not None and not (port.isdigit() and 0 < int(port) < 65536)):
            raise ConfigError(f"{entry!r} is not host:port (e.g. \"kafka-1:9092\")", path=path)
        out.append((m.group("v6") or m.group("host"), int(port) if port else 9092))
    if not out:
        raise ConfigError("at least one broker address is needed", path=path)
    return out
