"""Waiting on a few descriptors without select.

`select.select` raises ValueError for a descriptor at or past FD_SETSIZE (1024), and a
worker serving a thousand connections, or a test process that has started many servers,
holds descriptors that high; poll has no such limit, so every blocking wait outside the
event loop goes through here."""
from __future__ import annotations

import select
from typing import Iterable


def _poll(fds: Iterable, events: int, timeout: float | None) -> bool:
    p = select.poll()
    for fd in fds:
        p.register(fd, events)
    return bool(p.poll(None if timeout is None else timeout * 1000))


def wait_readable(fds: Iterable, timeout: float | None) -> bool:
    """Block until one of `fds` (descriptors or objects with fileno()) is readable, or
    `timeout` seconds pass (None: no limit).  True when one is readable or hung up."""
    return _poll(fds, select.POLLIN, timeout)


def wait_writable(fd, timeout: float | None) -> bool:
    """Block until `fd` can take more bytes, or `timeout` seconds pass."""
    return _poll((fd,), select.POLLOUT, timeout)
