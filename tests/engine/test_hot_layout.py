"""The objects every request goes through keep their instance attributes within what Python
3.11 keeps in their class's shared key table (30 names): past it an instance gets a dict of its
own, and every attribute read and method call on it (a connection's `pump`, `room`,
`flush_out`, `fast_reply`; a queue's `add` and `remove`; its journal's records) is looked up
generically instead of by specialised bytecode (issue 8, c=1: -2.5k instructions a request when
a connection went from 32 attributes to 29).  An attribute that applies only sometimes is a
class default, set on the instance when it applies (Conn's refuse_reads, refuse_writes,
last_activity).  The worker, its collection, queues and journals have __slots__ instead: no
dict at all, whatever names the process sets."""
from __future__ import annotations

from lanner.perf.hotloop import Rig

SHARED_KEYS_MAX = 30      # CPython 3.11 Objects/dictobject.c SHARED_KEYS_MAX_SIZE


def served(rig, chunks):
    c = rig.conns[0]
    for chunk in chunks:
        c.data_received(chunk)
        rig.turn()
    return c


def test_a_served_connection_keeps_at_most_30_attributes(tmp_path):
    rig = Rig(str(tmp_path), 1)
    try:
        c = served(rig, (b"set q 0 0 1\r\nx\r\n", b"get q\r\n", b"get q/open\r\n", b"get q/close\r\n",
                         b"delete q\r\n", b"stats\r\n"))
        assert b"".join(c.transport.written).startswith(b"STORED\r\nVALUE q 0 1\r\nx\r\nEND\r\nEND")
        assert len(vars(c)) <= SHARED_KEYS_MAX, sorted(vars(c))
    finally:
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
        for j in journals:                  # the empty queue's rewrite, on the writer's thread,
            j._rewrite_job[0].wait()        # is adopted by the next operation
        served(rig, (b"set q 0 0 1\r\nx\r\n", b"get q\r\n", b"get q+child\r\n"))
        assert all(j.rotations and j.rewrites for j in journals)
        assert b"".join(c.transport.written).count(b"VALUE") == 39 + 40 + 2
        for obj in [w, w.coll, queues["q"], queues["q+child"]] + journals:
            assert not hasattr(obj, "__dict__"), type(obj)
    finally:
        rig.close()
