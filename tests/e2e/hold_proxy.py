"""A TCP proxy between the router and PostgreSQL that holds the replication stream at a
transaction's Commit: once ``armed``, everything up to the Commit ('C') of the first
transaction of at least ``min_rows`` row changes is passed on, then that message and all
after it wait until ``release`` is set (the router has received the whole transaction but
its end). ``holding`` says it is waiting there. (Smaller transactions pass: other tests'
logical messages reach every slot that asks for messages.)"""

from __future__ import annotations

import socket
import struct
import threading

from tests.e2e.wire_proxy import XLOG_HEADER, CorruptingProxy


class CommitHoldingProxy(CorruptingProxy):
    def __init__(self, target_port: int, host: str = "127.0.0.1", min_rows: int = 1000):
        super().__init__(target_port, host)
        self.min_rows = min_rows
        self.holding = threading.Event()
        self.release = threading.Event()

    def _server_to_client(self, server: socket.socket, client: socket.socket) -> None:
        buf, rows = b"", 0
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    break
                buf += data
                at = sent = 0  # the next message's offset; what of buf is passed on
                while len(buf) - at >= 5:
                    size = struct.unpack_from("!i", buf, at + 1)[0] + 1
                    if len(buf) - at < size:
                        break
                    kind = self._pgoutput_kind(buf, at)
                    if kind == b"B":
                        rows = 0
                    elif kind in (b"I", b"U", b"D"):
                        rows += 1
                    elif (kind == b"C" and rows >= self.min_rows and self.armed.is_set()
                          and not self.release.is_set()):
                        client.sendall(buf[sent:at])  # the transaction before its Commit
                        sent = at
                        self.holding.set()
                        self.release.wait()
                        self.holding.clear()
                    at += size
                client.sendall(buf[sent:at])
                buf = buf[at:]
        except OSError:
            pass
        finally:
            client.close()
            server.close()

    @staticmethod
    def _pgoutput_kind(buf: bytes, at: int) -> bytes | None:
        """The pgoutput message type of the XLogData in the CopyData at ``at``, else None."""
        if buf[at:at + 1] != b"d" or buf[at + 5:at + 6] != b"w":
            return None
        pg = at + 5 + XLOG_HEADER
        return buf[pg:pg + 1]
