"""`Conn.room` reads "the transport holds bytes" from `wbusy` (set by pause_writing, cleared by
resume_writing: spill.py), not from `transport.get_write_buffer_size()`, a method call per read
(issue 8).  That holds because a connection's transport has a high-water mark of 0
(Conn.connection_made): these tests check the contract on uvloop's real transport, over real
sockets, and that `room` still counts what the transport holds."""
from __future__ import annotations

import asyncio
import socket

import uvloop

from lanner.fronts.conn import REPLY_BUDGET, room_for
from tests.fronts.harness import SOCKET_BUFFER, Rig


class Watched(asyncio.Protocol):
    """Records whether uvloop paused writing, beside what the transport says it holds."""

    def __init__(self) -> None:
        self.busy = False
        self.transport = None
        self.log: list[tuple[bool, int]] = []

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=0, low=0)     # as Conn.connection_made

    def pause_writing(self) -> None:
        self.busy = True

    def resume_writing(self) -> None:
        self.busy = False
        self.log.append((self.busy, self.transport.get_write_buffer_size()))


def test_uvloop_pauses_writing_exactly_while_its_transport_holds_bytes():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        server_sock, client_sock = socket.socketpair()
        client_sock.setblocking(False)
        proto = Watched()
        transport, _ = await loop.connect_accepted_socket(lambda: proto, server_sock)
        transport.write(b"small")                  # the socket takes it all: nothing held
        assert not proto.busy and transport.get_write_buffer_size() == 0
        big = b"x" * (8 << 20)                     # more than the socket's buffers take
        transport.write(big)
        assert proto.busy and transport.get_write_buffer_size() > 0
        got = 0
        while got < len(big) + 5:                  # the client reads it all
            try:
                data = client_sock.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0)             # the loop writes what the socket takes now
                continue
            got += len(data)
        while proto.busy:                          # the last write's completion
            await asyncio.sleep(0)
        assert transport.get_write_buffer_size() == 0
        assert proto.log and all(size == 0 for _, size in proto.log)     # resumed only when empty
        transport.close()
        client_sock.close()

    loop = uvloop.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(scenario(), 30))
    finally:
        loop.close()


def test_room_counts_the_bytes_a_transport_holds(tmp_path):
    rig = Rig(tmp_path)
    try:
        c = rig.connect()
        conn = c.conn
        assert conn.room() == conn.idle_room
        conn.transport.write(b"x" * (SOCKET_BUFFER + 1000))    # the client reads nothing
        assert conn.wbusy and conn.transport.get_write_buffer_size() == 1000
        assert conn.room() == room_for(0, REPLY_BUDGET - 1000, conn.reply_size)
        c.read()                                                 # it reads: resume_writing
        assert not conn.wbusy and conn.room() == conn.idle_room
    finally:
        rig.close()
