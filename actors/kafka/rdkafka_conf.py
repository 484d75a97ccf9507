"""librdkafka's settings of pgrouter: the producer's defaults and the connection settings
of the clients beside it (admin client, readers), without importing the clients themselves
(``actors.kafka.librdkafka`` and ``actors.kafka.admin`` both use them)."""

from __future__ import annotations

import logging
from typing import Any

from router.config.kafka_settings import LIBRDKAFKA, translate

#: batch sizes and buffers match KafkaPythonClient's; no Nagle on the broker sockets (a small
#: produce request may wait for the TCP acknowledgement of the previous one; kafka-python
#: sets TCP_NODELAY too). ``linger.ms`` stays 5: 0 made the router's librdkafka send a
#: request per record at 1,000 one-row transactions/s, +30% CPU (bench/latency.py), which
#: on a busy machine cost more latency than the linger saved (docs/performance.md)
DEFAULTS: dict[str, Any] = {
    "linger.ms": 5,
    "socket.nagle.disable": True,
    "batch.size": 1024 * 1024,
    "batch.num.messages": 10_000,
    "queue.buffering.max.messages": 100_000,
    "queue.buffering.max.kbytes": 32 * 1024,
    "delivery.timeout.ms": 60_000,
    "request.timeout.ms": 30_000,
    "max.in.flight.requests.per.connection": 5,
    # the first backoff before a (re)connection, doubled up to reconnect.backoff.max.ms (10 s)
    # on every failure: librdkafka's 100 ms held the first metadata request of every start
    # ~50 ms (it drops the bootstrap connection for the broker's own and waits to reconnect)
    "reconnect.backoff.ms": 10,
}
_ADMIN_KEYS = ("client.id", "security.protocol", "sasl.", "ssl.", "request.timeout.ms",
               "reconnect.backoff", "socket.")
#: librdkafka's own log lines (connection retries…) go through Python logging, under the
#: "kafka" logger that ``actors.services.log`` quiets like kafka-python's: failures that matter reach
#: the sink as typed delivery errors. Its critical ones are silenced too: a fenced producer
#: (a woken former ``[ha]`` leader) logged raw "TXNERR"/"FATAL" lines at LOG_CRIT, while the
#: same error reaches ``error_cb`` as fatal and the router says it in one line of its own
_LOGGER = logging.getLogger("kafka.librdkafka")
_LOGGER.setLevel(logging.CRITICAL + 1)


def connection_conf(bootstrap_servers, settings: dict) -> dict:
    """librdkafka's settings for a connection beside the producer (admin client, reader):
    the producer's connection, security and timeout defaults (``librdkafka.DEFAULTS``), the
    config's ``[kafka.settings]`` of those kinds over them, the brokers, and its logger."""
    conf = {k: v for k, v in DEFAULTS.items() if k.startswith(_ADMIN_KEYS)}
    conf.update({k: v for k, v in translate(dict(settings), LIBRDKAFKA).items()
                 if k.startswith(_ADMIN_KEYS)})
    conf["bootstrap.servers"] = (bootstrap_servers if isinstance(bootstrap_servers, str)
                                 else ",".join(bootstrap_servers))
    conf["logger"] = _LOGGER  # librdkafka's log lines through Python logging, as the producer's
    return conf
