"""Undoing state changes whose records never became durable (issue 11, defect 4: disk full).

A queue changes its memory first and records the change in its storage's buffer; the owner
writes (and, for `sync = always`, fsyncs) the buffers once per batch and only then sends the
batch's replies.  When that write or fsync fails, the records after the last good byte are
lost, so the memory changes they stood for must be undone too: otherwise a refused `set`
stays in the queue (and is written once space returns, a duplicate of the client's retry),
and a read the client never received is forgotten on restart.

Every recorded change leaves an entry here:

    (medium, mark, queue, kind, item, xid, ctx)

* `medium` is the byte stream the record went into (a `Journal`, or the `PartitionLog` that
  every cmdlog queue of a partition shares) and `mark` the stream position where the record
  starts.  Positions only grow, across rotations and rewrites, so "every record at or after
  position P" is always well defined.
* `ctx` is whatever the owner said it was serving (`UndoLog.ctx`): the worker puts the
  request there, so a rolled-back change tells it which reply must turn into an error.  A
  change made on nobody's behalf (expiry sweep, discard of a full queue, an abort after a
  disconnect) has ctx None.

`rollback(medium, P)` undoes, newest first, every entry of `medium` at or after P, so each
undo sees exactly the state its change produced; `trim()` forgets entries whose records are
safe (`medium.committed_mark`: written, or fsynced when the storage's policy is "always").
Entries of other media are untouched: queues do not share records, only cmdlog queues share a
stream, and they are undone together.

What an undo means for the client (the worker applies it, server/worker.py):
* ADD: the item leaves the queue; the `set` is answered SERVER_ERROR.
* REMOVE / OPEN: the item goes back to the head; the reader is answered SERVER_ERROR instead
  of the item (the reply had not left the worker: replies wait for the batch's write), and an
  open read leaves the connection's session.
* UNREMOVE / CONFIRM: the item is reserved again under its xid.  The client that asked is
  answered SERVER_ERROR; nobody owns the read any more, so the worker "strands" it and aborts
  it again once writes succeed (or replay rolls it back at the next start).
"""
from __future__ import annotations

from dataclasses import dataclass

try:                            # COMPILED: as in memcache_commands.py (undo.pxd)
    import cython
    COMPILED = cython.compiled
except ImportError:             # pure Python without Cython installed
    COMPILED = False

ADD, REMOVE, OPEN, UNREMOVE, CONFIRM = range(5)
#: An expired item's move to another worker's queue opened (its REMOVE_TENTATIVE), and
#: confirmed (its CONFIRM_REMOVE): an open read of the queue's own (queue.py `_moving`).
#: Undone, the first puts the item back at the head (it expires and moves again), the
#: second reopens the move; the collection strands it, to be confirmed again (failures.py).
MOVE_OPEN, MOVE_CONFIRM = 5, 6
#: A plain read held open until the process that writes its reply has written it, then
#: confirmed or aborted (queues/held.py).  Undone, the first puts the item back at the head
#: (its reply becomes SERVER_ERROR); the others hold it again, and the worker strands it.
HELD_OPEN, HELD_CONFIRM, HELD_ABORT = 7, 8, 9
#: The ctx of an expire_to_queue move: nobody's request, and an add the global total_items
#: never counted; a worker makes a rolled-back move again (server/moves.py).
MOVE = object()


class FanoutCopy:
    """The ctx of the copies a write to a fanout master puts in its children (§5.6): nobody's
    reply (the set's is the master's), but they go with the master's add when that is rolled
    back, so a set answered SERVER_ERROR leaves no copy anywhere.  `master`: (medium, mark) of
    the master's ADD record once made (None: it made none, and the copies just stay)."""
    __slots__ = ("master",)

    def __init__(self) -> None:
        self.master: tuple | None = None

    def pending(self) -> bool:
        """The master's record may still be rolled back: its copies' entries are kept."""
        m = self.master
        return m is not None and m[1] >= m[0].committed_mark


class ForwardedMove(tuple):
    """The ctx of a move another worker sent (OP_FORWARD_ADD): the (peer, conn, req) key of the
    ack a rollback must turn into SERVER_ERROR, so the sender sends the item again; like
    MOVE's, an add total_items never counted."""
    __slots__ = ()


KIND_NAMES = ("add", "remove", "open", "abort", "confirm", "move", "move confirm", "held", "held confirm",
              "held abort")


@dataclass(slots=True)
class Undone:
    """One change taken back: for the owner to fix up what it told the client."""
    ctx: object
    kind: int
    queue: str
    item: object
    xid: int


class UndoLog:
    __slots__ = ("entries", "ctx", "copies")

    def __init__(self) -> None:
        self.entries: list[tuple] = []
        self.ctx: object = None
        self.copies = False      # FanoutCopy entries may be here (trim looks for them only then)

    def __len__(self) -> int:
        return len(self.entries)

    def trim(self, through=None) -> None:
        """Forget the entries whose records are committed (once per batch: usually all).
        `through`: a medium whose records are all committed (the batch just wrote it,
        GroupCommit.write_out), which the common batch then need not ask (a property's frame,
        per turn)."""
        entries = self.entries
        if not entries:
            return
        # The common batch: one medium, written through its newest record.  A medium's marks
        # grow along the list (a rollback cuts its newer entries off with its records), so
        # its newest entry committed means all of them are; the one-medium check is a C loop
        # (_of_one: compiled, a loop over the tuples' first fields; no set built, no medium hashed).
        last = entries[-1]
        medium = last[0]
        if (medium is through or last[1] < medium.committed_mark) and _of_one(entries, medium):
            entries.clear()
            return
        medium = None
        committed = 0
        keep = None
        copies = self.copies
        for e in entries:
            if e[0] is not medium:
                medium = e[0]
                committed = medium.committed_mark
            if e[1] >= committed or (copies and e[6].__class__ is FanoutCopy and e[6].pending()):
                if keep is None:
                    keep = []
                keep.append(e)
        self.entries = keep if keep is not None else []
        if copies:
            self.copies = any(e[6].__class__ is FanoutCopy for e in self.entries)

    def rollback(self, medium, mark: int) -> list[Undone]:
        """Undo, newest first, every change recorded in `medium` at or after `mark`."""
        out: list[Undone] = []
        keep = []
        for e in reversed(self.entries):
            if e[0] is medium and e[1] >= mark:
                queue, kind, item, xid = e[2], e[3], e[4], e[5]
                queue.revert(kind, item, xid, e[1])
                out.append(Undone(e[6], kind, queue.name, item, xid))
            else:
                keep.append(e)
        keep.reverse()
        self.entries = keep
        return out

    def copies_of(self, medium, mark: int) -> list[tuple]:
        """(medium, mark) to roll back, the earliest per medium, for the fanout copies whose
        master's ADD in `medium` at or after `mark` was just rolled back."""
        first: dict[int, tuple] = {}
        for e in self.entries:
            ctx = e[6]
            if ctx.__class__ is FanoutCopy and ctx.master is not None and ctx.master[0] is medium \
                    and ctx.master[1] >= mark:
                m = e[0]
                if id(m) not in first or e[1] < first[id(m)][1]:
                    first[id(m)] = (m, e[1])
        return list(first.values())

    def forget(self, medium) -> None:
        """`medium` is gone (its queue was deleted): nothing of it can be rolled back any more."""
        self.entries = [e for e in self.entries if e[0] is not medium]


def _of_one(entries: list, medium) -> bool:
    """Whether every entry is `medium`'s (UndoLog.trim's common batch).  In the compiled build
    a C function (undo.pxd), where countOf(map(itemgetter(0), entries), medium) called the
    itemgetter per entry."""
    for e in entries:
        if e[0] is not medium:
            return False
    return True


def counted_adds(undone: list[Undone]) -> int:
    """How many of `undone` are adds the collection's total_items counted: every add but a
    move's (a master's and each fanout copy).  A copy's ctx becomes None on the way (nobody's
    reply); a MOVE's stays, for the owner to make the move again (server/moves.py)."""
    n = 0
    for u in undone:
        ctx = u.ctx
        if ctx is MOVE or ctx.__class__ is ForwardedMove:
            continue
        if ctx.__class__ is FanoutCopy:
            u.ctx = None
        if u.kind == ADD:
            n += 1
    return n


if COMPILED:
    # interpreted code reads and sets `ctx` as a `__slots__` field (memcache_commands.pxd)
    _c_slot_fields(UndoLog, ("ctx", "copies"))
