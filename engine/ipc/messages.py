"""The messages fronts and workers exchange over the rings.

Protocol-neutral: a memcache `get q/t=500/open`, a text `get q 500` and (later)
a thrift `get` all become one GET request; the front turns the response back
into its own protocol's bytes.  The hot path uses one fixed `struct` header and
raw bytes after it (no msgpack: it costs ~0.3-0.7 us per message per side);
only control-ish payloads (stats, reload) carry msgpack.

Request:  conn u32 | req u32 | op u8 | flags u8 | qlen u16 | a i64 | b i64 | queue | payload
Response: conn u32 | req u32 | status u8 | flags u8 | pad u16 | value i64 | payload

`conn` names the client connection inside its front (the ring says which
front), `req` is the front's per-connection sequence number, so a response
finds its slot in that connection's in-order reply queue.
"""
from __future__ import annotations

import struct

REQ = struct.Struct("<IIBBHqq")
RESP = struct.Struct("<IIBBHq")
REQ_SIZE = REQ.size
RESP_SIZE = RESP.size

# -- request ops -----------------------------------------------------------------------------
OP_SET = 1            # a = expiry epoch ms (0 = none); payload = data
OP_GET = 2            # flags F_*; a = timeout ms (< 0: do not wait)
OP_CONFIRM = 3        # a = count (memcache/text confirm)
OP_MONITOR = 4        # a = timeout ms, b = max items (< 0: max_open_transactions)
OP_DELETE = 5
OP_FLUSH = 6
OP_FLUSH_EXPIRED = 7
OP_FLUSH_ALL = 8
OP_FLUSH_ALL_EXPIRED = 9
OP_STATS = 10         # payload: msgpack list of queue names (empty: all)
OP_DISCONNECT = 11    # the connection is gone: abort its open reads, cancel its waiters; no reply
OP_RELOAD = 12        # no queue; reply when done
OP_ALIAS_PUT = 13     # queue = alias name, a = items, b = bytes; accounting only, no reply
OP_FORWARD_ADD = 14   # from another worker (expire_to_queue): add without fanout or totals; req =
                      # the sender's move number; the reply (conn FWD_ACK_CONN, req) is its ack,
                      # R_OK once the add is written; a = moves.HELD: the sender's journal holds
                      # the item (server/moves.py)
OP_DUMP_CONFIG = 15
OP_PUT_MANY = 16      # payload = msgpack list of items (an int: the size of an item dropped unread,
                      # refused, protocols/oversized.py); a = expiry; adds in order, stops at the
                      # first refusal; R_VALUE = how many were added (thrift put)
OP_TGET = 17          # thrift get: a = timeout ms, b = max items, payload = i64 auto-abort ms;
                      # R_DATA = msgpack [[data, id], ...]
OP_TCONFIRM = 18      # payload = msgpack list of server-wide ids; R_VALUE = how many were pending
OP_TABORT = 19
OP_TPEEK = 20         # R_DATA = msgpack [head or None, items, bytes, logsize, age, waiters, open]
OP_SET_DATA = 21      # payload = the next piece of a streamed set body (see bodies.py); the
                      # reply to the set comes after the last piece
OP_HANDOFF = 22       # worker to worker: adopt this connection (local.py); flags = connection kind,
                      # a = handoff seq (its fd travels on the handoff channel), payload = unparsed
                      # input; R_OK adopted, R_ERROR declined (the sender keeps it)
OP_HELD = 23          # front to owner, once per turn: a = how many of the hold ids in payload (i64
                      # each) were written to their clients, the rest were not; no reply
                      # (server/holding.py)

# -- request flags ---------------------------------------------------------------------------
F_OPEN = 1
F_CLOSE = 2
F_ABORT = 4
F_PEEK = 8
F_CONFIRM_ALL = 16    # text protocol: confirm every open read on the queue first
F_NOREPLY = 32
F_THRIFT = 64         # every request of a thrift connection: on DISCONNECT its open reads
                      # outlive it (§3.3); its calls are serial, never sent behind an error
F_STREAM = 128        # SET: b = body size, the body follows in OP_SET_DATA pieces (bodies.py)
F_AFTER_BODY = F_OPEN  # SET with F_STREAM: a = ms (memcache's relative exptime) counted from
                       # the body's last piece, not an epoch ms (a set bit of a get's flags)
F_HOLD = F_STREAM     # GET from a worker's own client, sent while the connection waits on another
                      # worker: a plain read is held until its reply is written (Waiting.op_get)

# -- response statuses -----------------------------------------------------------------------
R_OK = 0              # STORED / DELETED / END ...
R_NOT_STORED = 1
R_ITEM = 2            # payload = item data
R_EMPTY = 3
R_ERROR = 4           # protocol violation (memcache ERROR, text error text in payload)
R_CLIENT_ERROR = 5    # payload = reason
R_SERVER_ERROR = 6    # payload = reason
R_VALUE = 7           # value = an integer result
R_DATA = 8            # payload = msgpack
R_END = 9             # end of a monitor stream

# -- response flags --------------------------------------------------------------------------
RF_MORE = 1           # more responses follow for this request (monitor)
RF_CLOSE = 2          # the front must close the connection after writing the reply
RF_HELD = 4           # value = a hold id: the owner holds the item(s) until the front says the
                      # reply was written (OP_HELD; server/holding.py)

pack_req = REQ.pack
unpack_req = REQ.unpack_from
pack_resp = RESP.pack
unpack_resp = RESP.unpack_from


def resp_fields(head) -> tuple:
    """(conn, req, status, flags, pad, value) of a reply's head: packed for a ring, or the tuple
    a reply to the worker's own client keeps (the fused path's: it never leaves the process,
    so it is never packed; publish packs one that would)."""
    return head if head.__class__ is tuple else unpack_resp(head, 0)

# -- large messages --------------------------------------------------------------------------
# A ring record must fit in the ring, but an item may be larger (8 MiB items are a
# benchmark scenario).  A message over CHUNK bytes travels as a marker record (conn id
# FRAG_CONN, never a real connection) giving its total length, then raw chunk records;
# the consumer reassembles them.  Small messages, the hot path, pay nothing for this.
FRAG_CONN = 0xFFFFFFFF
#: The conn of a response on a worker→worker ring: the ack of an OP_FORWARD_ADD (server/moves.py).
#: Requests on those rings never carry it, so the receiver tells the two apart by it.
FWD_ACK_CONN = 0xFFFFFFFE
FRAG = struct.Struct("<IQ")
CHUNK = (1 << 18) - 64     # fits the smallest ring (worker to worker, 256 KiB)


#: A payload shorter than this makes a message of one record whatever its head (a head is at
#: most REQ_SIZE + a 16-bit queue name's length): a caller may `ring.send_parts` it directly.
SMALL_MESSAGE = CHUNK - REQ_SIZE - 0xFFFF


def send(ring, head: bytes, payload=b"") -> None:
    """Queue one message on `ring` (the caller publishes)."""
    n = len(head) + len(payload)
    if n <= CHUNK:
        ring.send_parts(head, payload)
        return
    ring.send(FRAG.pack(FRAG_CONN, n))
    whole = memoryview(head + bytes(payload))
    for i in range(0, n, CHUNK):
        ring.send(whole[i:i + CHUNK])


#: The one record length at which a record may be a FRAG marker (requests and responses are
#: longer; a chunk record is only ever read while `Reassembler.partial` is set).
FRAG_SIZE = FRAG.size
assert FRAG_SIZE < min(REQ_SIZE, RESP_SIZE)


class Reassembler:
    """Consumer side of `send`: feed every record, get whole messages back.  A consumer may take
    a record as the whole message itself, without the call, while `partial` is None and the
    record is not FRAG_SIZE long (worker.py's and front.py's drains)."""

    __slots__ = ("partial", "_need")

    def __init__(self) -> None:
        self.partial: bytearray | None = None     # a large message being put together
        self._need = 0

    def feed(self, rec):
        """Return the message this record completes (the record itself when it is a
        whole small message), or None while a large message is still arriving."""
        buf = self.partial
        if buf is not None:
            buf += rec
            if len(buf) < self._need:
                return None
            self.partial = None
            return buf
        if len(rec) == FRAG_SIZE and rec[0] == 0xFF and rec[1] == 0xFF and rec[2] == 0xFF \
                and rec[3] == 0xFF:
            self._need = FRAG.unpack_from(rec)[1]
            self.partial = bytearray()
            return None
        return rec

    def reset(self) -> None:
        self.partial = None
        self._need = 0
