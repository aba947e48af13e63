"""Moving a client socket to another worker: the file descriptor over SCM_RIGHTS.

When every request of a connection goes to one other worker, the worker that
accepted it hands the connection to that worker (local.py).  Two things travel:

* the socket itself, here: one AF_UNIX SOCK_DGRAM socketpair per receiving
  worker, made by the supervisor before any fork; every worker sends on the
  shared end, the receiver reads the other end.  A datagram is
  ``sender u32 | seq u64`` plus one fd, so each send is atomic and names its
  handoff;
* the connection's state (its id in the sender's front slot, the input it read
  and did not parse), as an OP_HANDOFF request on the ring from the sender's
  front slot to the receiver, so it is ordered after every earlier request of
  that connection (a fire-and-forget `set ... noreply` included).

The sender writes the datagram before it publishes the ring record, so when the
receiver reads the record the fd is already queued in its socket: `Inbox.take`
never waits.

Faults.  A datagram whose record never comes (the sender died in between) is
closed when the supervisor reports the sender down (`drop_from`).  A datagram whose
receiver died is void: every serving worker closes what that receiver left unread
when it hears of the death (server/local.py, `LocalFront.worker_down`), and the
replacement receiver does again before it says ready (`drop_all`).  While a
datagram sits unread its fd keeps the client's socket open, so those rules are
what turn a crash mid-handoff into a closed connection for the client (after an
error line when the sender lives: local.py), never a silent hang or a reply from
the wrong place.
"""
from __future__ import annotations

import logging
import os
import socket
import struct

log = logging.getLogger(__name__)

HEAD = struct.Struct("<IQ")


def channels(nworkers: int) -> list[tuple[socket.socket, socket.socket]]:
    """(receive end, send end) per worker; call before forking."""
    out = []
    for _ in range(nworkers):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        a.setblocking(False)
        b.setblocking(False)
        out.append((a, b))
    return out


def send(chan: socket.socket, sender: int, seq: int, fd: int) -> bool:
    """Queue `fd` for the receiver of `chan`; False (nothing sent) when its queue is full."""
    try:
        socket.send_fds(chan, [HEAD.pack(sender, seq)], [fd], socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError as e:
        log.error("cannot pass a connection to another worker: %s", e)
        return False
    return True


class Inbox:
    """The receiving worker's end: fds by (sender, seq) until their ring record claims them."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.stash: dict[tuple[int, int], int] = {}

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> None:
        """Move every queued datagram's fd into the stash."""
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, HEAD.size, 4)
            except (BlockingIOError, InterruptedError):
                return
            if len(data) != HEAD.size or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                continue
            key = HEAD.unpack(data)
            old = self.stash.pop(key, None)
            if old is not None:       # a dead predecessor's leftover under the same key
                os.close(old)
            self.stash[key] = fds[0]

    def take(self, sender: int, seq: int) -> int | None:
        fd = self.stash.pop((sender, seq), None)
        if fd is None:
            self.read()
            fd = self.stash.pop((sender, seq), None)
        return fd

    def drop_from(self, sender: int) -> int:
        """`sender` died: its handoffs whose records never came are void.  Returns how many
        connections that ends (the sender had let go of their count: fronts/counters.py)."""
        self.read()
        keys = [k for k in self.stash if k[0] == sender]
        for key in keys:
            os.close(self.stash.pop(key))
        return len(keys)

    def drop_all(self) -> None:
        self.read()
        for fd in self.stash.values():
            os.close(fd)
        self.stash.clear()
