"""Answers of the little HTTP servers tests stand in for a registry, a router or a proxy
(``BaseHTTPRequestHandler`` requests)."""

from __future__ import annotations


def send_head(req, status: int, length: int, content_type: str | None = None,
              **headers: str) -> None:
    """The status line and headers: ``Content-Type`` (when given), ``Content-Length``,
    then ``headers``."""
    req.send_response(status)
    if content_type is not None:
        req.send_header("Content-Type", content_type)
    req.send_header("Content-Length", str(length))
    for k, v in headers.items():
        req.send_header(k, v)
    req.end_headers()


def answer(req, status: int, body: bytes, content_type: str, **headers: str) -> None:
    """A whole answer: ``send_head`` and ``body``."""
    send_head(req, status, len(body), content_type, **headers)
    req.wfile.write(body)
