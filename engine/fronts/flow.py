"""Flow control's arithmetic: how many commands a connection may take with replies in flight
(the rule itself is in Conn's class doc, fronts/conn.py).  A module of its own so that the
compiled build makes `room_for` a C function (flow.pxd) that Conn calls as one, and every other
reader (tests, tools) gets the same one rule."""
from __future__ import annotations

from lanner.fronts.spill import REPLY_BUDGET

#: Commands in flight (sent, reply not yet written) per connection, whatever their size.
MAX_INFLIGHT = 1024
#: Replies estimated at most this size leave room for MAX_INFLIGHT with nothing in flight
#: (room_for), so the estimate's every move below it changes nothing there.
SMALL_REPLY = REPLY_BUDGET // MAX_INFLIGHT


def room_for(n: int, free: int, size: int) -> int:
    """How many more commands flow control allows with `n` replies in flight, `free` bytes of
    REPLY_BUDGET left and replies of about `size` bytes (Conn.room; Conn class doc)."""
    # reply m = n, n + 1, ... in flight is allowed while m < MAX_INFLIGHT, m * size < free
    k = MAX_INFLIGHT - n
    if size > 0:
        by_size = (free - 1) // size + 1 - n if free > 0 else -n
        if by_size < k:
            k = by_size
    elif free <= 0:
        k = 0
    return k if k > 0 else (1 if n == 0 else 0)      # the first one always is
