"""Lanner: a durable, Kestrel-compatible message-queue server that uses every core.

The layers, bottom up (docs/design.md walks through them):

- `lanner.queues`   — queues, their collection, waiters, sessions, placement;
                      importable without any networking.
- `lanner.storage`  — the storage seam and its one factory; Kestrel journals
                      (`storage.journal`) and workq command logs (`storage.cmdlog`).
- `lanner.ipc`      — shared-memory rings, ring messages, control sockets.
- `lanner.server`   — the supervisor, workers, cleaner and status block.
- `lanner.fronts`   — the event loops that speak to clients.
- `lanner.protocols`— pure parsers and encoders: bytes in, commands out.
- `lanner.tools`    — offline tools (qdump, qpack, cmdlog).

Time always comes from a clock object (`lanner.clock`).
"""

__version__ = "0.1.0"
