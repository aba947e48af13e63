"""Open thrift reads per (connection, queue): the cap max_open_transactions applies to
(reference §3.3).  The counts of a connection go when it disconnects while its reads live on
(thrift read ids outlive their connection), so they are indexed by connection: a disconnect
drops its own entries instead of scanning every connection's (issue 8)."""
from __future__ import annotations


class OpenReadCounts:
    """(src, conn, queue) -> open reads, with only the operations the worker uses (`get`,
    `[key] = n`, `del [key]`, `drop_conn`), each O(1) or O(the connection's queues)."""
    __slots__ = ("_counts", "_by_conn")

    def __init__(self) -> None:
        self._counts: dict[tuple, int] = {}
        self._by_conn: dict[tuple, set[str]] = {}      # (src, conn) -> queues it has counts on

    def get(self, key: tuple, default=None):
        return self._counts.get(key, default)

    def __getitem__(self, key: tuple) -> int:
        return self._counts[key]

    def __contains__(self, key: tuple) -> bool:
        return key in self._counts

    def __len__(self) -> int:
        return len(self._counts)

    def __setitem__(self, key: tuple, n: int) -> None:
        if key not in self._counts:
            self._by_conn.setdefault(key[:2], set()).add(key[2])
        self._counts[key] = n

    def __delitem__(self, key: tuple) -> None:
        del self._counts[key]
        conn = key[:2]
        queues = self._by_conn[conn]
        queues.discard(key[2])
        if not queues:
            del self._by_conn[conn]

    def drop_conn(self, src: int, conn: int) -> None:
        """Forget every count of connection (src, conn)."""
        for queue in self._by_conn.pop((src, conn), ()):
            del self._counts[(src, conn, queue)]
