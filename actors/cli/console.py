"""``pgrouter console --router URL [--router URL …]``: the overview of several routers (and
appliers) on one page, served at ``--listen`` (127.0.0.1:9188 by default) from their
``/api/status`` (``actors.console.overview``). Routers with ``[console] token`` are asked
with the token read from ``--token-file`` (never from the command line, which ``ps`` shows),
and only them: a router answering with a redirect is shown as such, the redirect not followed.
"""

from __future__ import annotations

import argparse
import pathlib
import signal
import urllib.parse

from router.config.router import parse_listen
from router.errors import ConfigError

from ..console.overview import Overview
from ..services import log
from ..services.http import listener

_log = log.get("console")


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--router", action="append", required=True, metavar="URL",
                   help="a router's (or applier's) console URL, http(s)://host:port "
                        "(its [metrics] listen; repeatable)")
    p.add_argument("--listen", default="127.0.0.1:9188", metavar="HOST:PORT",
                   help="where the overview answers (default 127.0.0.1:9188)")
    p.add_argument("--token-file", metavar="FILE",
                   help="a file holding the bearer token the routers' [console] token asks for")


def routers(urls: list[str]) -> list[str]:
    for i, url in enumerate(urls):
        parts = urllib.parse.urlsplit(url)
        if "@" in parts.netloc:
            # the page relays each URL to whoever opens it, and ps shows the command line
            raise ConfigError("credentials in the URL are refused (the overview's page would "
                              "show them): give the routers' [console] token with "
                              "--token-file, and the URL as http(s)://host:port",
                              path=f"--router[{i}]")
        try:
            parts.port
        except ValueError:
            parts = parts._replace(netloc="")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"expected http(s)://host:port, got {url!r}",
                              path=f"--router[{i}]")
    return urls


def token(path: str | None) -> str:
    if not path:
        return ""
    try:
        return pathlib.Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the token: {exc.strerror or exc}",
                          path="--token-file") from exc


def _stop(signum, frame):
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    app = Overview(routers(args.router), token(args.token_file))
    host, port = parse_listen(args.listen, path="--listen")
    server = listener(host, port, app, path="--listen")
    log.setup()
    signal.signal(signal.SIGTERM, _stop)  # SIGTERM stops it as Ctrl-C does: exit 0
    shown = f"[{host}]" if ":" in host else host
    log.event(_log, "console listening", url=f"http://{shown}:{server.server_address[1]}/",
              routers=len(args.router))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
