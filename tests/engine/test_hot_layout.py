"""The objects every request goes through keep their instance attributes within what Python
3.11 keeps in their class's shared key table (30 names): past it an instance gets a dict of its
own, and every attribute read and method call on it (a connection's `pump`, `room`,
`flush_out`, `fast_reply`; a queue's `add` and `remove`; its journal's records) is looked up
generically instead of by specialised bytecode (issue 8, c=1: -2.5k instructions a request when
a connection went from 32 attributes to 29).  The connections and fronts, the worker, its
collection, queues and journals have __slots__ instead: no dict at all, whatever names the
process sets."""
from __future__ import annotations

import socket

import pytest

from lanner.fronts.conn import TYPED as CONN_TYPED, Conn, FrontBase, WorkerBase
from lanner.fronts.slots import Part, Slot
from lanner.fronts.front import Front
from lanner.fronts.memcache import MemcacheConn
from lanner.ipc import handoff
from lanner.ipc.messages import R_ERROR
from lanner.perf.hotloop import NullTransport, Rig
from lanner.queues.item import QItem
from lanner.queues.collection import QueueCollection
from lanner.queues.queue import C_TYPED, CollectionBase, PersistentQueue
from lanner.queues.undo import UndoLog
from lanner.server.local import LocalFront
from lanner.server.worker import Worker
from lanner.storage.journal.journal import C_TYPED as JOURNAL_C_TYPED, Journal

SHARED_KEYS_MAX = 30      # CPython 3.11 Objects/dictobject.c SHARED_KEYS_MAX_SIZE


def served(rig, chunks):
    c = rig.conns[0]
    for chunk in chunks:
        c.data_received(chunk)
        rig.turn()
    return c


class ClosableTransport(NullTransport):
    """A benchmark transport a handed-off connection may close."""

    closed = False

    def close(self) -> None:
        self.closed = True


def assert_no_dict(*objs) -> None:
    """Slots only: nothing any instance sets can give these a dict (and generic lookups)."""
    for o in objs:
        assert not hasattr(o, "__dict__"), type(o)
        with pytest.raises(AttributeError):
            o.not_an_attribute = 1


def wait_reply(rig, client: socket.socket, want: bytes) -> bytes:
    """Turn the worker's loop until `client` has read `want` (loopback: a few turns)."""
    got = b""
    for _ in range(10_000):
        rig.turn()
        try:
            got += client.recv(65536)
        except BlockingIOError:
            pass
        if len(got) >= len(want):
            break
    return got


def test_connections_and_fronts_have_no_instance_dict_and_serve_after_a_handoff(tmp_path):
    """A connection (conn.py) and its front (front.py, server/local.py) are slotted: the
    names a handoff sets (`moving`, `moved`; `adopted` on the adopter's new connection) are
    slots, so no process's history can push their per-request reads off the specialised
    path.  Served before and after a declined handoff, handed off, and adopted over a real
    socket."""
    rig = Rig(str(tmp_path), 1)
    front = rig.worker.front
    listener = client = None
    recv_end, send_end = handoff.channels(1)[0]
    try:
        c = served(rig, (b"set q 0 0 1\r\nx\r\n", b"get q\r\n", b"get q/open\r\n", b"get q/close\r\n",
                         b"delete q\r\n", b"stats\r\n"))
        assert b"".join(c.transport.written).startswith(b"STORED\r\nVALUE q 0 1\r\nx\r\nEND\r\nEND")
        assert_no_dict(c, front)

        # a handoff the adopter declined: the connection stays and serves on
        c.moving = True                             # as LocalFront.hand_off sets it
        declined = Slot()
        declined.parts.append(Part(declined, 0, 1, 1))
        declined.parts[0].status = R_ERROR
        front.handed_off(c, declined)
        assert not c.moving and not declined.close
        c.transport.written.clear()
        served(rig, (b"set q 0 0 1\r\ny\r\n", b"get q\r\n"))
        assert b"".join(c.transport.written) == b"STORED\r\nVALUE q 0 1\r\ny\r\nEND\r\n"

        # a handoff the adopter took: this side closes without ending anything
        gone = MemcacheConn(front)
        gone.connection_made(ClosableTransport())
        gone.moving = True
        taken = Slot()
        taken.parts.append(Part(taken, 0, 1, 1))
        front.handed_off(gone, taken)
        assert gone.moved and taken.close
        assert_no_dict(gone)

        # adopted: the socket arrives over a handoff channel, the adopter serves it
        listener = socket.create_server(("127.0.0.1", 0))
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        rig.worker.inbox = handoff.Inbox(recv_end)
        assert handoff.send(send_end, front.local, 1, accepted.fileno())
        accepted.close()                            # the channel's copy is the adopter's now
        before = set(front.conns)
        front.adopt(front.index, 99, 1, 0, 1, b"set q 0 0 1\r\nz\r\n")
        client.setblocking(False)
        assert wait_reply(rig, client, b"STORED\r\n") == b"STORED\r\n"
        (new_id,) = set(front.conns) - before
        adopted = front.conns[new_id]
        assert adopted.adopted
        client.sendall(b"get q\r\n")
        assert wait_reply(rig, client, b"VALUE q 0 1\r\nz\r\nEND\r\n") == b"VALUE q 0 1\r\nz\r\nEND\r\n"
        assert_no_dict(adopted, front)
    finally:
        for s in (client, listener, recv_end, send_end):
            if s is not None:
                s.close()
        rig.close()


def test_the_worker_its_queues_and_journals_have_no_instance_dict(tmp_path):
    """Slots, no dict: whatever names anything in the process sets (the shared key table of a
    class holds every name set on any of its instances), the worker, its collection, a plain
    queue, a fanout child and their journals keep specialised lookups, after sets, gets, an
    open read and its confirm, read-behind, rotations and a rewrite."""
    (tmp_path / "lanner.toml").write_text('[default]\nmax_memory_size = "2KiB"\nmax_journal_size = "4KiB"\n'
                                          'default_journal_size = "1KiB"\nmin_journal_compact_delay = 0\n')
    rig = Rig(str(tmp_path), 1, config_file=str(tmp_path / "lanner.toml"))
    try:
        item = b"." * 200
        sets = [b"set q 0 0 %d\r\n%s\r\n" % (len(item), item)] * 40
        gets = [b"get q\r\n"] * 38 + [b"get q+child\r\n"] * 40
        c = served(rig, [b"get q+child\r\n"] + sets + [b"get q/open\r\n", b"get q/close\r\n"] + gets)
        w = rig.worker
        queues = w.coll.queues
        assert queues["q+child"].is_fanout_child and not queues["q"].is_fanout_child
        journals = [queues[name].storage for name in ("q", "q+child")]
        for j in journals:                  # an empty queue's rewrite still on the writer's
            if j._rewrite_job is not None:  # thread is adopted by the next operation (one done
                j._rewrite_job[0].wait()    # before its journal looked was adopted at once)
        served(rig, (b"set q 0 0 1\r\nx\r\n", b"get q\r\n", b"get q+child\r\n"))
        assert all(j.rotations and j.rewrites for j in journals)
        assert b"".join(c.transport.written).count(b"VALUE") == 39 + 40 + 2
        for obj in [w, w.coll, queues["q"], queues["q+child"]] + journals:
            assert not hasattr(obj, "__dict__"), type(obj)
    finally:
        rig.close()


@pytest.mark.parametrize("cls, typed", [(PersistentQueue, C_TYPED), (Journal, JOURNAL_C_TYPED),
                                        (Conn, ()), (FrontBase, ()), (Front, ()), (LocalFront, ()),
                                        (WorkerBase, ()), (CollectionBase, ()), (QItem, ()),
                                        (UndoLog, ("entries",))])
def test_a_queues_and_a_journals_fields_are_read_as_slots_in_either_build(cls, typed):
    """The mixins, the collection, the syncer and the factory read these fields from interpreted
    code: as `__slots__` in pure Python, and in the compiled build (queue.pxd, journal.pxd) as
    the C struct's fields, which Cython would give as getsets that 3.11 does not specialise
    (~245 instructions a read, perf/README.md stop 14) unless `_c_slot_fields` makes them member
    descriptors.  `typed`: fields with a C type (queue.pxd, journal.pxd, undo.pxd), getsets, off
    the request path.  An item's (item.pxd): the codec, read-behind and the cmdlog read them.
    A connection's too (conn.pxd): its mixins, subclasses and the front read them per request;
    and a front's (front.pxd, local.pxd): conn.py's def methods, the worker and the other
    protocols read them per request; and what a connection reads of its front and its worker
    (FrontBase, WorkerBase, conn.pxd): the worker's own code reads those per turn."""
    for name in cls.__slots__:
        if name not in typed:
            assert type(cls.__dict__[name]).__name__ == "member_descriptor", name


@pytest.mark.parametrize("cls, names", [(MemcacheConn, Conn.__slots__),
                                         (LocalFront, FrontBase.__slots__ + Front.__slots__ +
                                          LocalFront.__slots__),
                                         (Worker, WorkerBase.__slots__ + Worker.__slots__),
                                         (QueueCollection, CollectionBase.__slots__ +
                                          QueueCollection.__slots__)])
def test_each_of_a_connections_fields_holds_its_own_value(cls, names):
    """In the compiled build each member descriptor's offset into the C struct is found at load
    (_c_slot_fields): every field reads back what was written to it, in either build (a
    connection's, and a worker's own front's, its base's fields and its own).  A connection's
    C-typed fields (conn.TYPED: _c_member_fields) hold numbers: each its own."""
    c = cls.__new__(cls)
    marks = {n: i + 0.5 if n == "t_in" else i + 1 if n in CONN_TYPED else object()
             for i, n in enumerate(names)}
    for n, mark in marks.items():
        setattr(c, n, mark)
    assert all(getattr(c, n) is mark or n in CONN_TYPED and getattr(c, n) == mark
               for n, mark in marks.items())
