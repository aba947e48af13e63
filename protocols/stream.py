"""What a front relies on in every incremental parser (memcache, text, admin HTTP), whatever its
protocol: how many bytes it holds, whether it has stopped, and the unparsed bytes a connection
handed to another process carries along.  Each parser keeps the bytes fed and not consumed in
`_buf` and its state in `_state`, and names the state values that mean "stopped" and "between
requests"."""
from __future__ import annotations


class StreamParser:
    __slots__ = ()
    BETWEEN: int          # the state between two requests (where a handoff may happen)
    STOPPED: int          # the state after the last request it will ever yield

    @property
    def buffered(self) -> int:
        """Bytes held and not yet parsed (the front can watch this for back-pressure)."""
        return len(self._buf)

    @property
    def stopped(self) -> bool:
        """True once a request that closes the connection (or an error that does) was yielded."""
        return self._state == self.STOPPED

    def unparsed(self) -> bytes | None:
        """The bytes fed and not parsed yet, when a fresh parser fed them would continue exactly
        where this one stands (between requests); None inside a request's data.  A connection
        handed to another process carries them along."""
        return bytes(self._buf) if self._state == self.BETWEEN else None
