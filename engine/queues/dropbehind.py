"""A flush in read-behind (queue.py `PersistentQueue.flush`): the items only the storage holds
go without being read back (a flush of millions of them read every one on the loop, issue 8); a
flush moves no item (§5.5), so nothing needs them.  Undone as one entry (`_Undrop`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from lanner.queues.undo import REMOVE

if TYPE_CHECKING:
    from lanner.queues.queue import PersistentQueue


def drop_behind(q: PersistentQueue) -> None:
    """Forget `q`'s items that only its storage holds; the in-memory ones stay for the flush."""
    n = q._length - len(q._items)
    nbytes = q._bytes - q._mem_bytes
    dropped = q.storage.drop_behind(n)
    if dropped is None:
        return
    q._length -= n
    q._bytes -= nbytes
    undo = q.undo
    if undo is not None and dropped[0] is not None:
        undo.entries.append((q.medium, dropped[0], _Undrop(q, n, nbytes, dropped[1]), REMOVE,
                             None, 0, undo.ctx))


class _Undrop:
    """The undo entry of a `drop_behind`, standing in for its queue (undo.py calls `revert` and
    reads `name`): the dropped items are counted again and the storage reads behind from where
    it was, so they come back in order behind the in-memory ones."""
    __slots__ = ("queue", "n", "nbytes", "token")

    def __init__(self, queue: PersistentQueue, n: int, nbytes: int, token) -> None:
        self.queue = queue
        self.n = n
        self.nbytes = nbytes
        self.token = token

    @property
    def name(self) -> str:
        return self.queue.name

    def revert(self, kind: int, item, xid: int, mark: int | None = None) -> None:
        q = self.queue
        q._length += self.n
        q._bytes += self.nbytes
        q.storage.undrop_behind(self.token)
