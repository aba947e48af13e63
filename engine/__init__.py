"""Lanner's engine: queues, their storage, and the processes that serve them.

Importable without any networking: a `QueueCollection` (collection.py) over
`PersistentQueue`s (queue.py) that keep their items in a Kestrel journal
(journal.py) or a workq command log (cmdlog.py), behind one storage seam
(storage.py).  Time always comes from a clock object (clock.py).

The server's processes live here too: supervisor.py forks worker.py (a shard
of the queues each), front processes (front.py, speaking the wire protocols of
../protocols) and cleaner.py, joined by shared-memory rings (ring.py).
"""

__version__ = "0.1.0"
