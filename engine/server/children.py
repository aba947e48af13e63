"""The supervisor's record of one child process, its restart backoff, and the two prctl
calls a freshly forked child makes (die with the supervisor; a name `ps` and `top` show)."""
from __future__ import annotations

import ctypes
import signal
import socket
from dataclasses import dataclass, field

from lanner.ipc import control
from lanner.ipc.mesh import CLEANER, WORKER

ZK = "zk"                    # the ZooKeeper server-set child (ops/serverset.py): no rings, no heartbeat
ADMIN = "admin"              # the role of the front that alone serves the admin port (no queue clients)

RESTART_WINDOW = 60.0        # seconds of restart history that count towards the backoff
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 5.0

@dataclass(eq=False)
class Child:
    kind: str                 # "worker" | "front" | "cleaner"
    index: int
    role: str = ""            # ADMIN: the front slot that serves the admin port only
    pid: int = 0              # 0: not running (dead, waiting for its replacement)
    sock: socket.socket | None = None     # supervisor's end of the control socketpair
    reader: control.Reader | None = None
    ready: bool = False
    restarts: list = field(default_factory=list)        # monotonic times of recent deaths
    awaiting_acks: set = field(default_factory=set)     # peers yet to acknowledge its peer_down
    awaiting_up: set = field(default_factory=set)       # peers yet to acknowledge its peer_up
    restart_at: float | None = None                     # when its replacement may be forked
    murdered: float | None = None                       # silence (s) when killed for it

    @property
    def key(self) -> tuple[str, int]:
        return (self.kind, self.index)

    def __str__(self) -> str:
        return self.role or f"{self.kind} {self.index}"

    @property
    def process_name(self) -> str:
        """The name `ps`, `top` and the per-process metrics show (lanner-w0, lanner-f1,
        lanner-admin, lanner-cleaner, lanner-zk)."""
        if self.role or self.kind in (ZK, CLEANER):
            return f"lanner-{self.role or self.kind}"
        return f"lanner-{self.kind[0]}{self.index}"


def backoff(restarts: int) -> float:
    """Delay before forking a child that died `restarts` times within RESTART_WINDOW."""
    return min(BACKOFF_FIRST * (2 ** (restarts - 1)), BACKOFF_MAX)


def relay_reload(children: dict, exclude: tuple | None) -> None:
    """Tell the children to re-read the config the supervisor just read: after SIGHUP every one
    but the cleaner; after a client's `reload` only the fronts other than `exclude`, which asked
    (its rings reloaded every worker).  A front that already caught up (shm.ConfigEpoch)
    skips it; one that is idle would otherwise keep the old settings until its next request."""
    for key, c in children.items():
        if key == exclude or c.kind == CLEANER or not c.pid:
            continue
        if exclude is not None and c.kind == WORKER:
            continue
        try:
            control.send(c.sock, {"cmd": "reload"})
        except OSError:
            pass


def pdeathsig() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)       # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def name_process(title: str) -> None:
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(15, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)   # PR_SET_NAME
    except (OSError, AttributeError):
        pass
