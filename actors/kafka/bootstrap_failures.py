"""Why kafka-python could not reach Kafka. Its ``KafkaTimeoutError`` says only "Unable to
bootstrap"; what failed at each attempt (a TLS handshake with a listener that does not speak
TLS, a SASL handshake refused) is only logged, by ``kafka.net.manager``.
``watching()`` keeps those failures while a client is made, so the error can name them.

Rules:

* pgrouter silences the ``kafka`` loggers (``actors.services.log``): while anyone watches,
  the manager's warnings reach this handler only (not propagated), and its level and
  propagation are restored when the last watch ends.
* Watches at the same time (threads) each see every client's failures: the text names the
  last one as what the client met, which is right for the one-client CLIs using it.
* ``describe`` masks the config's secrets (``SECRETS``) should the library quote them.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from router.config.kafka_settings import SECRETS

_LOGGER = "kafka.net.manager"
#: the start of the manager's message for a failed bootstrap attempt (kafka-python 3.0)
_FAILED = "Bootstrap connection to"

_lock = threading.Lock()
_watches: list[list[BaseException]] = []
_saved: tuple[int, bool] | None = None


class _Handler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if str(record.msg).startswith(_FAILED) and len(args) >= 2:
            for failures in list(_watches):
                failures.append(args[1])


_HANDLER = _Handler(logging.WARNING)


@contextlib.contextmanager
def watching():
    """The failed bootstrap attempts of the kafka-python clients made inside, oldest first."""
    global _saved
    failures: list[BaseException] = []
    logger = logging.getLogger(_LOGGER)
    with _lock:
        if not _watches:
            _saved = (logger.level, logger.propagate)
            logger.addHandler(_HANDLER)
            logger.setLevel(logging.WARNING)
            logger.propagate = False
        _watches.append(failures)
    try:
        yield failures
    finally:
        with _lock:
            _watches.remove(failures)
            if not _watches and _saved is not None:
                logger.removeHandler(_HANDLER)
                logger.setLevel(_saved[0])
                logger.propagate = _saved[1]
                _saved = None


def describe(failures: list[BaseException], settings: dict) -> str:
    """``security_protocol … : <the last failure>`` for an error line; "" without failures.
    The protocol is named because the failures are the handshakes it asks for."""
    if not failures:
        return ""
    exc = failures[-1]
    text = str(exc)
    name = type(exc).__name__
    text = text if name in text else f"{name}: {text}"
    for key in SECRETS:
        secret = settings.get(key)
        if isinstance(secret, str) and secret:
            text = text.replace(secret, "***")
    return f"{security(settings)}: {text}"


def security(settings: dict) -> str:
    """``[kafka.settings]``'s protocol and SASL mechanism as the error names them."""
    out = f"security_protocol {settings.get('security_protocol', 'PLAINTEXT')}"
    if "sasl_mechanism" in settings:
        out += f", sasl_mechanism {settings['sasl_mechanism']}"
    return out
