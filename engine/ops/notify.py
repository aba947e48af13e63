"""systemd's readiness protocol (sd_notify(3)), written by hand: one datagram to
the AF_UNIX socket named by `NOTIFY_SOCKET` (a leading `@` is the abstract
namespace).  Without that variable, as outside systemd, it does nothing.

The supervisor sends `READY=1` at the moment it prints the `lanner ready` line
(every listener accepts), `RELOADING=1` then `READY=1` around a SIGHUP reload,
and `STOPPING=1` when it starts to shut down; `STATUS=` carries a line for
`systemctl status`.  Only the supervisor (the unit's main PID) sends.
"""
from __future__ import annotations

import os
import socket
import time


def notify(*fields: str, env: dict | None = None) -> bool:
    """Send `fields` (such as "READY=1") joined by newlines; True if sent."""
    addr = (os.environ if env is None else env).get("NOTIFY_SOCKET")
    if not addr or not fields:
        return False
    if addr[0] == "@":
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall("\n".join(fields).encode())
    except OSError:
        return False
    return True


def ready(status: str = "") -> bool:
    return notify("READY=1", f"MAINPID={os.getpid()}", *([f"STATUS={status}"] if status else []))


def reloading() -> bool:
    return notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")


def stopping() -> bool:
    return notify("STOPPING=1")
