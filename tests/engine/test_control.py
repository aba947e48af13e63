"""Control messages keep their framing when the socket's buffer is full."""
import socket
import threading

import msgpack

from lanner.ipc import control


def read_frames(sock: socket.socket, count: int) -> list[dict]:
    """Blocking reads of `count` length-prefixed msgpack messages."""
    buf, out = bytearray(), []
    while len(out) < count:
        chunk = sock.recv(1 << 16)
        assert chunk, "the peer closed mid-message"
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "little"):
            n = int.from_bytes(buf[:4], "little")
            out.append(msgpack.unpackb(bytes(buf[4:4 + n])))
            del buf[:4 + n]
    return out


def test_send_on_a_full_non_blocking_socket_waits_and_keeps_framing():
    a, b = socket.socketpair()
    control.Reader(a)                       # makes `a` non-blocking, as every process's end is
    assert not a.getblocking()
    big = {"cmd": "stats", "blob": b"x" * 1_000_000}    # larger than the socket's buffer
    received = []
    t = threading.Thread(target=lambda: received.extend(read_frames(b, 2)))
    t.start()
    control.send(a, big)                    # sendall raised BlockingIOError mid-message here
    control.send(a, {"cmd": "ready"})
    t.join(10)
    assert received == [big, {"cmd": "ready"}]
    a.close()
    b.close()
