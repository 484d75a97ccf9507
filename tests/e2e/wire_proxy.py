"""A TCP proxy between the router and PostgreSQL that corrupts one byte of the stream.

The client side is passed through untouched (an SSL or GSS encryption request is refused
with ``N`` here, so the stream stays readable); the server side is cut into protocol
messages. Once ``armed``, the first CopyData message carrying an XLogData ('w') whose
pgoutput message is an Insert gets its tuple marker ('N') replaced by ``Z``: exactly what a
bit flip in a server's reply would look like to the decoder.
"""

from __future__ import annotations

import socket
import struct
import threading

NEGOTIATION = {80877103, 80877104}  # SSLRequest, GSSENCRequest
XLOG_HEADER = 1 + 8 + 8 + 8  # 'w', start LSN, end LSN, send time


class CorruptingProxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1"):
        self.target = (host, target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.corrupted = threading.Event()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            while True:  # refuse encryption requests ourselves
                head = _recv_exact(client, 8)
                length, code = struct.unpack("!ii", head)
                if length == 8 and code in NEGOTIATION:
                    client.sendall(b"N")
                    continue
                break
            server = socket.create_connection(self.target)
            server.sendall(head)
        except OSError:
            client.close()
            return
        threading.Thread(target=_pipe, args=(client, server), daemon=True).start()
        self._server_to_client(server, client)

    def _server_to_client(self, server: socket.socket, client: socket.socket) -> None:
        buf = b""
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    break
                buf += data
                out = bytearray()
                while len(buf) >= 5:
                    size = struct.unpack("!i", buf[1:5])[0] + 1
                    if len(buf) < size:
                        break
                    msg, buf = bytearray(buf[:size]), buf[size:]
                    self._maybe_corrupt(msg)
                    out += msg
                client.sendall(out)
        except OSError:
            pass
        finally:
            client.close()
            server.close()

    def _maybe_corrupt(self, msg: bytearray) -> None:
        if msg[0:1] != b"d" or not self.armed.is_set() or self.corrupted.is_set():
            return
        body = 5
        if msg[body:body + 1] == b"w" and len(msg) > body + XLOG_HEADER + 5:
            pg = body + XLOG_HEADER
            if msg[pg:pg + 1] == b"I" and msg[pg + 5:pg + 6] == b"N":
                msg[pg + 5] = ord("Z")
                self.corrupted.set()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise OSError("closed")
        buf += part
    return buf


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
