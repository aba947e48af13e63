"""Set bodies that reach a worker in pieces, assembled per request.

A front streams a large `set` body to the worker as it arrives from the client instead of
buffering it whole: first an OP_SET with F_STREAM (a = expiry, b = the body's size, no payload),
then OP_SET_DATA messages with the same (connection, request) carrying the pieces in order.  With
F_AFTER_BODY, `a` is a relative expiry the worker counts from the last piece: Kestrel's "now" for
a set was when its whole request was in (reference §5.2), and a big body can take long to come.
Pieces of different connections interleave freely on the ring, which is why they are keyed here
and not reassembled by the ring's own chunking (`messages.Reassembler`, which needs a message's
records to be contiguous).  When the last piece is in, the worker adds the item and replies as
for a plain set.  A connection that goes away mid-body (OP_DISCONNECT), or a front that dies,
drops its partial bodies.
"""
from __future__ import annotations

import io


class Bodies:
    """Partial set bodies, keyed by (peer, connection, request)."""

    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open: dict[tuple[int, int, int], list] = {}

    def __len__(self) -> int:
        return len(self._open)

    def begin(self, src: int, conn: int, req: int, queue: str, expiry: int, size: int,
              flags: int) -> None:
        self._open[(src, conn, req)] = [queue, expiry, size, flags, None, 0]

    def more(self, src: int, conn: int, req: int, piece) -> tuple[str, bytes, int, int] | None:
        """Append a piece; when the body is complete return (queue, data, expiry, flags).
        Pieces of a body that was dropped (its connection left) are ignored.

        Each piece is copied once, as it comes, into a BytesIO made over a `bytes` of the
        body's size (its only reference, so written in place and never grown: growing it
        copied the body over and over), whose `getvalue` then hands over that very object as
        the item's `bytes`, without a copy (CPython).  Joining the pieces at the end instead
        was one 8 MiB copy of several ms on the owner's loop (issue 8: a small request waited
        behind it); this spreads the same copying over the turns the pieces arrive in.  A
        piece may be a view of a ring or an input buffer that is reused once this returns: it
        is copied here either way.  A body that came in one `bytes` piece is not copied."""
        key = (src, conn, req)
        entry = self._open.get(key)
        if entry is None:
            return None
        size = entry[2]
        got = entry[5]
        n = len(piece)
        if got + n >= size:
            del self._open[key]
            if got == 0 and n == size and type(piece) is bytes:
                return entry[0], piece, entry[1], entry[3]
            buf = entry[4] or io.BytesIO(bytes(size))
            buf.write(memoryview(piece)[:size - got])
            return entry[0], buf.getvalue(), entry[1], entry[3]
        if entry[4] is None:
            entry[4] = io.BytesIO(bytes(size))
        entry[4].write(piece)
        entry[5] = got + n
        return None

    def drop(self, src: int, conn: int | None = None) -> None:
        """Forget the partial bodies of one connection, or of every connection of a peer."""
        for key in [k for k in self._open if k[0] == src and (conn is None or k[1] == conn)]:
            del self._open[key]
