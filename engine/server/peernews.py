"""The supervisor's news of a child going down or coming back, to the processes that share
rings with it, and the acknowledgements it waits for.

`peer_down(X)` is acknowledged (`ack_down`) before X's replacement is forked (supervisor.py,
"Replacing a child").  `peer_up(X')` is acknowledged too (`ack_up`), and X' is announced ready
(its "X ready" log line, which operators and tests wait for) only once every live peer has
acknowledged it: before, the line came first, and a client that acted on it could still be
told "worker N is restarting" by a peer that had not read its `peer_up` yet.  A peer that dies
meanwhile is not waited for (its own replacement starts knowing nothing of the old X).
"""
from __future__ import annotations

import logging

from lanner.ipc import control

log = logging.getLogger("lanner.supervisor")


def tell(sup, target, what: str, about) -> None:
    """Send `target` a peer_down/peer_up about `about`, in target's numbering.  Either is
    awaited even when the send fails: the target acknowledges or dies."""
    if what == "peer_down":
        about.awaiting_acks.add(target.key)
    elif what == "peer_up":
        about.awaiting_up.add(target.key)
    try:
        control.send(target.sock, {"cmd": what,
                                   "peer": sup.peers.as_seen_by(target.kind, about.kind, about.index)})
    except OSError:
        pass


def announce(sup, child, what: str) -> None:
    """Tell every live process that shares rings with `child` that it went down or came up."""
    for c in list(sup.children.values()):
        if c is not child and c.pid and c.kind in sup.peers.talk(child.kind):
            tell(sup, c, what, child)


def came_up(sup, child) -> None:
    """`child` said `ready`.  A replacement's peers hear `peer_up` first; it is announced once
    they all acknowledged it."""
    child.ready = True
    child.awaiting_up = set()
    if child.restarts:
        announce(sup, child, "peer_up")
    if child.awaiting_up:
        log.info("%s up; waiting for %d peers to hear it", child, len(child.awaiting_up))
    else:
        log.info("%s ready", child)


def acked_up(sup, child, msg: dict) -> None:
    """`child` acknowledged the `peer_up` of the peer `msg` names."""
    up = sup.children.get(sup.peers.named_by(child.kind, msg["peer"]))
    if up is not None:
        heard(up, child.key)


def gone(sup, child) -> None:
    """`child` died: it acknowledges nothing now, and its own `peer_up` news is void."""
    child.awaiting_up = set()
    for c in sup.children.values():
        c.awaiting_acks.discard(child.key)
        heard(c, child.key)


def heard(up, key) -> None:
    if key in up.awaiting_up:
        up.awaiting_up.discard(key)
        if not up.awaiting_up and up.ready:
            log.info("%s ready", up)
