"""Blocking waits outside the event loop work on descriptors past select's FD_SETSIZE.

A worker with a thousand connections, or a test process that has started many servers, holds
descriptors past 1024, where `select.select` raises ValueError; the wake fd, the control
socket's send, the cleaner's wait for its child and the server-set loop wait through poll."""
from __future__ import annotations

import os
import resource
import socket
import threading

import pytest

from lanner.ipc import control
from lanner.ipc.fdwait import wait_readable, wait_writable
from lanner.ipc.wake import WakeFd

HIGH = 1500


@pytest.fixture
def high_fd():
    """dup2 a descriptor to a number past 1024 (raising the soft limit, which needs no
    privilege); closed afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= HIGH + 10:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    made = []

    def make(fd: int) -> int:
        high = HIGH + len(made)
        os.dup2(fd, high)
        os.close(fd)
        made.append(high)
        return high

    yield make
    for fd in made:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_pipe_past_1024_is_waited_on(high_fd):
    r, w = os.pipe()
    r = high_fd(r)
    assert wait_readable((r,), 0) is False
    os.write(w, b"x")
    assert wait_readable((r,), 0) is True
    os.close(w)


def test_the_wake_fd_past_1024_wakes(high_fd):
    wake = WakeFd(high_fd(os.eventfd(0, os.EFD_NONBLOCK)))
    assert wake.wait(0) is False
    wake.signal()
    assert wake.wait(0) is True
    assert wake.drain() == 1
    wake.fd = -1        # the fixture closes it


def test_a_control_message_waits_for_room_on_a_socket_past_1024(high_fd):
    a, b = socket.socketpair()
    a_high = socket.socket(fileno=high_fd(os.dup(a.fileno())))
    a.close()
    a_high.setblocking(False)
    while wait_writable(a_high, 0):         # fill the socket's buffer
        try:
            a_high.send(b"x" * 65536)
        except BlockingIOError:
            break
    assert wait_writable(a_high, 0) is False
    drained = []

    def reader():
        while True:
            chunk = b.recv(1 << 20)
            drained.append(chunk)
            if chunk.endswith(b"\x81\xa3cmd\xa4done"):
                return

    t = threading.Thread(target=reader)
    t.start()
    control.send(a_high, {"cmd": "done"})    # select raised ValueError here
    t.join(10)
    assert not t.is_alive()
    a_high.detach()
    b.close()
