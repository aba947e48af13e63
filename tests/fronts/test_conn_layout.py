"""Where a connection's fields lie in memory (conn.pxd, issue 8's c=100 -> c=1000 drop).  With a
thousand connections a connection's cache lines go cold between two of its requests, so each
line a request touches is a miss (perf/README.md, stop 23): the fields a fused set or get reads
or writes come first, within 4 lines, and the numbers it rewrites are C fields that interpreted
code still reads as int and float.  Every check holds in both builds: pure Python lays out
`__slots__` in the same order."""
from __future__ import annotations

import ctypes
import struct

from lanner.fronts.conn import TYPED, Conn
from lanner.fronts.memcache import MemcacheConn

#: What a fused `set` or plain `get` reads or writes of its connection: data_received, pump,
#: room, dispatch, MemcacheConn.store / on_get, fast_reply, note_reply and flush_out.
HOT = ("front", "parser", "out", "fast", "body", "stopped", "closing", "paused_writing",
       "blocked", "held", "spilled", "wbusy", "worker", "batch", "cur_fam", "count_bytes",
       "t_in", "next_req", "id", "idle_room", "reply_size", "nslots", "handlers", "transport",
       "reading_paused", "refuse_reads", "refuse_writes", "early", "unwritten", "touched",
       "local_bit", "batched")
LINE = 64
WORD = ctypes.sizeof(ctypes.c_void_p)


def offsets(cls) -> dict[str, int]:
    """Each field's byte offset in an instance, found by writing a marker into it: an object
    (the slot holds its address), or for a C field (TYPED) a number whose raw bits it holds."""
    obj = cls.__new__(cls)
    size = type(obj).__basicsize__
    found = {}
    for i, name in enumerate(Conn.__slots__):
        if name == "t_in":
            mark = -1.0e-301 - i
            raw = struct.unpack("<q", struct.pack("<d", mark))[0]
        elif name in TYPED:
            mark = raw = 0x5EED0C0FFEE + i
        else:
            mark = object()
            raw = None
        setattr(obj, name, mark)
        words = struct.unpack("<%dq" % (size // WORD), ctypes.string_at(id(obj), size))
        hits = [k * WORD for k, w in enumerate(words) if w in (id(mark), raw)]
        assert len(hits) == 1, (name, hits)
        found[name] = hits[0]
    return found


def test_the_fields_a_fused_request_touches_come_first_within_four_lines():
    """Before, they were spread over the whole struct (`count_bytes`, read by every
    data_received, was its 39th field of 42): 7 lines a request where 4 now do."""
    at = offsets(MemcacheConn)
    hot = sorted(at[n] for n in HOT)
    rest = sorted(at[n] for n in Conn.__slots__ if n not in HOT)
    assert hot[-1] < rest[0], [n for n in HOT if at[n] > rest[0]]
    assert hot[-1] + WORD - hot[0] <= 4 * LINE


def test_a_requests_numbers_read_and_write_as_int_and_float():
    """In the compiled build they are C fields (conn.pxd) behind member descriptors
    (_c_member_fields): interpreted readers (routed.py, rendered.py, tests) see what they saw."""
    c = MemcacheConn.__new__(MemcacheConn)
    for i, name in enumerate(TYPED):
        assert type(Conn.__dict__[name]).__name__ == "member_descriptor", name
        setattr(c, name, 7 + i)
    assert [getattr(c, name) for name in TYPED] == [7 + i for i in range(len(TYPED))]   # each its own
    c.t_in = 1.25
    c.next_req = 0xFFFFFFFF
    assert (c.t_in, c.next_req) == (1.25, 0xFFFFFFFF)
    assert type(c.t_in) is float and type(c.id) is int


def test_nslots_counts_the_reply_queue_and_early_is_none_while_empty(tmp_path):
    """The fused path's per-request tests read `nslots`, not the `slots` deque, and `early`'s
    own field, not a dict (conn.py): both must say what the containers hold."""
    from lanner.perf.hotloop import Rig
    r = Rig(str(tmp_path), 1)
    try:
        [c] = r.conns
        assert c.nslots == 0 and c.early is None
        s = c.new_slot()
        c.reply_now(b"END\r\n")
        assert c.nslots == len(c.slots) == 2      # the reply waits behind the open slot
        s.done = True
        c.drain_slots()
        assert c.nslots == len(c.slots) == 0 and c.room() == c.idle_room
        c.new_slot(blocking=True)
        c.close_after_replies()
        c.connection_lost(None)
        assert c.nslots == len(c.slots) == 0 and c.early is None
    finally:
        r.close()
