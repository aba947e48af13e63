"""A connection's fused replies of one batch rendered as their requests run, released as one.

The fused path (inline.py) knows a set's or plain get's answer the moment Worker.inline_set /
inline_get returns, but the reply may leave only with its batch (after the journal write, and
under sync "always" after the fsync: server/commit.py).  Carried one by one through the
worker's batch and back (the reply's tuple, `LocalFront.deliver` looking up the connection,
`fast_reply` matching, popping and unpacking its `fast` entry, the latency observed) a reply
cost ~100 bytecodes and two calls, the most a request did at 32 requests a write (perf/README.md,
stop 14).  So a connection's replies of one read and one batch become one entry: a list of
their bytes, carried, held, failed and released as one reply.

The hybrid (perf/README.md, stops 15 and 17): a connection's first fused reply of a read and a
batch goes the per-reply way, unchanged, so a closed-loop client (one request a read) never
pays for an entry, nor does a read of two (an entry of two cost more than two replies alone:
perf/README.md, stop 17).  The third turns the three into an entry (`opens`: the first two's
replies rendered from their tuples in the batch); the fourth and later append their pieces to
it in the connection's own frame (MemcacheConn.store and on_get), counted in `Conn.batched` (flow control
counts every reply in flight).  Worker.inline_set / inline_get return their answer for that,
their reply last in the batch, which a joining request takes back off.

An entry holds exactly three pieces a reply: a value's VALUE line, its bytes and END; any other
reply its line and two empty pieces (which cost the write's join nothing).  So reply k starts
at piece 3k, the entry holds len // 3 replies, and piece 3k says what reply k was (STORED or
NOT_STORED: a set; anything else: a get).  Its requests are numbered one after the other from
the entry's first (`members`): the connection closes its entry (`Conn.batch = None`) when it
numbers any other request (notify, request, route_fast, a fused request answered alone), when
it reads new bytes in a turn with other reads (the requests of a read share their read's time;
a quiet turn's read is its batch's only one) and when the worker's batch ends (the entry
remembers the batch's reply list, `Conn.batch_of`, which the batch's end replaces).

In `fast` an entry is `(first request, None, Conn.release_entry, (entry, first request, t0),
family, t0, -1)`: fast_reply renders it as any reply with nothing known in advance, so the
per-reply path pays nothing for it (inline.py).  In the worker's batch it is `(front slot,
(conn, first request, R_OK, 0, 0, 0), entry)`, so every rule that moves, holds or fails
replies moves, holds or fails the entry with its batch.  A failed write or fsync
(GroupCommit.undo_replies) cuts the entry at its first undone request (`cut`; the head stays):
the replies before it leave, that request's reply is the SERVER_ERROR every failed request
gets, and the connection closes, as if each reply had been carried alone.  A write that goes
behind (GroupCommit.hold_unwritten) parts the entry before its first request with a record in
it (`split`): the replies before it leave with the batch, as they would have one by one, and
only the rest waits for the write, so a write behind delays no reply it would not have delayed
carried alone.
"""
from __future__ import annotations

from lanner.ipc.messages import R_EMPTY, R_ITEM, R_NOT_STORED, R_OK
from lanner.ops.latency import FAMILIES
from lanner.protocols import memcache_replies as mr

#: a set's and an empty get's reply as an entry's three pieces
STORED3 = (mr.STORED, b"", b"")
NOT_STORED3 = (mr.NOT_STORED, b"", b"")
END3 = (mr.END, b"", b"")

_SET = FAMILIES.index("set")
_GET = FAMILIES.index("get")
_LINES = {R_OK: STORED3, R_NOT_STORED: NOT_STORED3, R_EMPTY: END3}


def opens(c, replies: list, pieces: tuple) -> bool:
    """The connection's third fused reply of a read and a batch, `pieces` (its reply last in
    the batch, `replies[-1]`): whether it and the two before it became an entry.  They do when
    those were fused requests of this worker numbered just before it, from the same read,
    their replies the two before it, answered with what an entry holds (a line, or a value
    under SPLICE_MIN).  (From the third: an entry of two costs more than the two alone.)"""
    fast = c.fast
    if len(fast) < 2:
        return False
    second = fast[-1]
    first = fast[-2]
    req = first[0]
    t0 = c.t_in                 # the read's time: a C double (conn.pxd), a new float each read
    if second[5] != t0 or first[5] != t0 or second[6] != -1 or first[6] != -1 or \
            len(replies) < 3 or nth(req, 1) != second[0] or nth(req, 2) != replies[-1][1][1]:
        return False
    a = _pieces(first, replies[-3], c.id)
    if a is None:
        return False
    b = _pieces(second, replies[-2], c.id)
    if b is None:
        return False
    ent = [*a, *b, *pieces]
    dst = replies[-3][0]
    del replies[-2:]
    replies[-1] = (dst, (c.id, req, R_OK, 0, 0, 0), ent)
    fast.pop()
    fast[-1] = (req, None, c.release_entry, (ent, req, t0), first[4], t0, -1)
    c.batch = ent
    c.batch_of = replies
    c.batched += 2
    return True


def _pieces(waiting: tuple, reply: tuple, conn: int) -> tuple | None:
    """A fused request's reply (its `fast` entry `waiting`, its `reply` in the batch) as an
    entry's three pieces, or None if it is not one an entry holds."""
    head = reply[1]
    if head.__class__ is not tuple or head[1] != waiting[0] or head[0] != conn or head[3]:
        return None
    status = head[2]
    ok = waiting[1]
    if status == R_ITEM:
        payload = reply[2]
        if ok is not mr.value_heads or payload.__class__ is not bytes or len(payload) >= mr.SPLICE_MIN:
            return None
        return ok[waiting[3], len(payload)], payload, mr.END_TAIL
    if status in _LINES and (ok is mr.STORED or ok is mr.value_heads):
        return _LINES[status]
    return None


def members(first: int, n: int):
    """The request numbers of an entry's `n` replies (Conn's numbering: 0 is skipped)."""
    return [nth(first, k) for k in range(n)]


def keys(dst: int, head: tuple, entry: list) -> list:
    """The (front slot, conn, request) key of every request in the entry (the reply's head is
    the entry's first request's): what the rollback and the write-behind look replies up by."""
    conn, first = head[0], head[1]
    return [(dst, conn, req) for req in members(first, len(entry) // 3)]


def cut(entry: list, failed: set, dst: int, head: tuple, why: bytes) -> bool:
    """Cut `entry` at its first request in `failed` ((dst, conn, req) keys): the replies before
    it stay, then that request's first piece (what it was, for its latency) and the reason
    `why` its reply gives, nothing after them (the connection closes there); `release` takes
    the two off.  Whether one had failed.  An entry cut before is cut again only at an
    earlier request (len // 3 counts only the replies before its cut)."""
    for k, key in enumerate(keys(dst, head, entry)):
        if key in failed:
            marker = entry[3 * k]
            del entry[3 * k:]
            entry += (marker, why)
            return True
    return False


def split(reply: tuple, held: set) -> tuple[tuple | None, tuple | None]:
    """An entry's reply of the batch, `(dst, head, entry)`, parted before its first request in
    `held` (keys whose records a write behind has yet to write): (what leaves with the batch,
    what waits for the write), either None when empty.  The part that waits keeps the entry
    list itself (the connection's `fast` names it) and starts at its own first request; the
    one that leaves is a new list, which `fast_reply` knows for a part (inline.py)."""
    dst, head, entry = reply
    for k, key in enumerate(keys(dst, head, entry)):
        if key in held:
            if not k:
                return None, reply
            done = entry[:3 * k]
            del entry[:3 * k]
            rest = (dst, (head[0], key[2], R_OK, 0, 0, 0), entry)
            return (dst, head, done), rest
    return reply, None


def release(out: list, entry: list, latency, t0: float) -> tuple[int, int]:
    """Hand the entry's replies to the connection's output `out` and observe the latency (from
    their read, `t0`) of all but the first (fast_reply observes that one, as any reply's);
    (the last one's size, how many), the size -1 when the last one closes the connection: the
    SERVER_ERROR of the request the entry was cut at (`cut`, which leaves two pieces past a
    whole reply).  The last reply's size is estimate enough for flow control
    (Conn.note_reply), as for fast_reply's chains."""
    heads = entry[3::3]
    m = len(heads)
    sets = heads.count(mr.STORED)
    if sets != m:
        sets += heads.count(mr.NOT_STORED)
    if sets:
        latency.since_n(_SET, t0, sets)
    if sets != m:
        latency.since_n(_GET, t0, m - sets)
    m += 1
    if not len(entry) % 3:
        out += entry
        return len(entry[-3]) + len(entry[-2]) + len(entry[-1]), m
    why = entry.pop()
    del entry[-1]                       # the failed request's first piece (`cut`)
    out += entry
    out.append(mr.server_error(bytes(why).decode("latin-1", "replace")))
    return -1, m


def family(entry: list) -> int:
    """The latency family of the entry's first reply (a set's or a get's)."""
    return _SET if entry[0] is mr.STORED or entry[0] is mr.NOT_STORED else _GET


def nth(first: int, n: int) -> int:
    """The request `n` after `first` in Conn's numbering (0 is skipped)."""
    req = first + n
    return req - 0xFFFFFFFF if req > 0xFFFFFFFF else req
