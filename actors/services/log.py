"""Structured logs: ``key=value`` (or one JSON object a line), lowercase messages, secrets
masked. Every actor logs through ``event(logger, message, **fields)``; the last warnings and
errors are also kept for the console (``actors.console.board.problems``)."""

from __future__ import annotations

import json
import logging
import sys

from router.config.router import mask_dsn

from ..console import board


class _KeyValue(logging.Formatter):
    def __init__(self, as_json: bool):
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", {})
        if self.as_json:
            if record.exc_info:
                fields = {**fields, "exception": self.formatException(record.exc_info)}
            return json.dumps({"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
                               "level": record.levelname.lower(), "logger": record.name,
                               "msg": record.getMessage(), **fields}, default=str)
        parts = [f"{self.formatTime(record, '%H:%M:%S')} {record.levelname.lower():<7} "
                 f"{record.name}: {record.getMessage()}"]
        for k, v in fields.items():
            text = str(v)
            parts.append(f'{k}="{text}"' if " " in text else f"{k}={text}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_KeyValue(fmt == "json"))
    root = logging.getLogger("pgrouter")
    root.handlers[:] = [handler, board.problems]  # the console's last warnings and errors
    root.setLevel(level.upper())
    root.propagate = False
    # the Kafka client logs every reconnect attempt at warning/error: keep ours readable
    logging.getLogger("kafka").setLevel(logging.CRITICAL)


def get(name: str) -> logging.Logger:
    return logging.getLogger(f"pgrouter.{name}")


def event(logger: logging.Logger, msg: str, *, level: int = logging.INFO, **fields) -> None:
    if "dsn" in fields:
        fields["dsn"] = mask_dsn(str(fields["dsn"]))
    logger.log(level, msg, extra={"fields": fields})
