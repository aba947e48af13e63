"""Control messages between the supervisor, workers, fronts and the cleaner.

Rare, small messages (ready, peer down/up, reload, pack requests) as
length-prefixed msgpack over a Unix socketpair.  The hot path never uses this:
client requests travel over the rings (ring.py, messages.py).
"""
from __future__ import annotations

import socket
import struct

import msgpack

from lanner.ipc.fdwait import wait_writable

_LEN = struct.Struct("<I")


def send(sock: socket.socket, msg: dict) -> None:
    """Write one whole message, even on a socket a Reader made non-blocking: a partial
    write would corrupt the framing, so a full buffer waits for the peer to read (a peer
    that never does is stuck, and the heartbeat replaces it, which ends this wait)."""
    body = msgpack.packb(msg)
    data = memoryview(_LEN.pack(len(body)) + body)
    while data:
        try:
            data = data[sock.send(data):]
        except BlockingIOError:
            wait_writable(sock, 1.0)


class Reader:
    """Non-blocking reader of length-prefixed frames; `eof` turns true when the peer is gone."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()
        self.eof = False
        sock.setblocking(False)

    def read(self) -> list[dict]:
        while True:
            try:
                chunk = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.eof = True
                break
            if not chunk:
                self.eof = True
                break
            self.buf += chunk
        out = []
        while len(self.buf) >= 4:
            (n,) = _LEN.unpack_from(self.buf)
            if len(self.buf) < 4 + n:
                break
            out.append(msgpack.unpackb(bytes(self.buf[4:4 + n])))
            del self.buf[:4 + n]
        return out


def request(sock: socket.socket, msg: dict, timeout: float | None = None) -> dict:
    """Blocking send + wait for one reply (used by the cleaner's clients in stand-alone tools)."""
    sock.setblocking(True)
    sock.settimeout(timeout)
    send(sock, msg)
    head = _recv_exact(sock, 4)
    (n,) = _LEN.unpack(head)
    return msgpack.unpackb(_recv_exact(sock, n))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("control peer closed")
        buf += chunk
    return bytes(buf)
