"""What a worker's answer to a memcache set or one-key get becomes on the wire, and whether it
closes the connection: the fused path (Conn.fast_reply's `render`), the routed path and the slot
path (a slot's `finish`) all render it here, so the three cannot disagree.  Compiled
(engine/compiled.py): set_fused and get1_fused run once per reply.
"""
from __future__ import annotations

from lanner.fronts.slots import Slot
from lanner.ipc.messages import (R_CLIENT_ERROR, R_EMPTY, R_END, R_ERROR, R_ITEM, R_OK, R_SERVER_ERROR,
                                 RF_CLOSE)
from lanner.protocols import memcache_replies as mr
from lanner.protocols.memcache_replies import END_TAIL, SPLICE_MIN, STORED, value_heads

def set_reply(status: int, flags: int, payload, call=None) -> tuple[bytes, bool]:
    """A one-queue set's reply and whether it closes the connection (both paths use it)."""
    if status == R_OK:
        return STORED, False
    if status == R_SERVER_ERROR:
        return mr.server_error(bytes(payload).decode("latin-1", "replace")), True
    if status == R_CLIENT_ERROR:
        return mr.client_error(bytes(payload).decode("latin-1", "replace")), True
    return mr.NOT_STORED, False


def get1_reply(status: int, flags: int, payload, key) -> tuple[bytes, bool]:
    """A one-key get's reply (`key`: as the client sent it, echoed in VALUE) and whether it
    closes the connection (both paths use it)."""
    if status == R_ITEM:
        return mr.get_reply(key, payload), False       # big: not copied (spill.py writes it)
    if status == R_END or status == R_EMPTY:
        return mr.END, False
    failure = failure_reply(status, flags, payload)
    return failure if failure is not None else (b"", False)


def set_fused(out: list, status: int, flags: int, payload, call=None) -> int:
    """set_reply for the fused path (Conn.fast_reply's `render`, which answers R_OK
    with the STORED it was given): the reply goes to `out`; its size, or -1 if it closes the
    connection."""
    return _fused(out, set_reply(status, flags, payload))


def get1_fused(out: list, status: int, flags: int, payload, key) -> int:
    """get1_reply for the fused and routed paths, as set_fused, for what Conn.fast_reply
    does not splice itself: a value up to SPLICE_MIN that is not `bytes` (a routed reply's view
    of the ring, reused once read: copied here) goes to `out` as its VALUE line, its own bytes
    and END, joined only with the rest of the turn's output (Conn.flush_out)."""
    if status == R_ITEM:
        n = len(payload)
        if n < SPLICE_MIN:
            head = value_heads[key, n]
            out += (head, payload if payload.__class__ is bytes else bytes(payload), END_TAIL)
            return len(head) + n + 7
    return _fused(out, get1_reply(status, flags, payload, key))


def _fused(out: list, reply: tuple[bytes, bool]) -> int:
    data, close = reply
    out.append(data)
    return -1 if close else len(data)


def failure_reply(status: int, flags: int, payload) -> tuple[bytes, bool] | None:
    """The reply to a failed part (worker error, protocol violation) and whether it closes the
    connection; None if `status` is no failure."""
    if status == R_SERVER_ERROR:
        return mr.server_error(bytes(payload).decode("latin-1", "replace")), True
    if status == R_CLIENT_ERROR:
        return mr.client_error(bytes(payload).decode("latin-1", "replace")), bool(flags & RF_CLOSE)
    if status == R_ERROR:
        return mr.ERROR, bool(flags & RF_CLOSE)
    return None


def finish_stored(slot: Slot) -> None:
    p = slot.parts[0]
    slot.out, slot.close = set_reply(p.status, p.flags, p.payload)


def finish_alias_set(slot: Slot) -> None:
    """STORED only if every destination stored it (§1.3); `slot.call`: noreply."""
    if any(p.status == R_SERVER_ERROR for p in slot.parts):
        first_failure(slot)
    else:
        slot.out = STORED if all(p.status == R_OK for p in slot.parts) else mr.NOT_STORED
    if slot.call and not slot.close:
        slot.out = b""


def finish_get1(slot: Slot) -> None:
    """One key's reply; `slot.call`: the key as the client sent it (echoed in VALUE)."""
    p = slot.parts[0]
    slot.out, slot.close = get1_reply(p.status, p.flags, p.payload, slot.call)


def first_failure(slot: Slot) -> bool:
    """If any part failed (worker error, protocol violation), make that the reply."""
    for p in slot.parts:
        failure = failure_reply(p.status, p.flags, p.payload)
        if failure is not None:
            slot.out, slot.close = failure
            return True
    return False
