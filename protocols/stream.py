"""What a front relies on in every incremental parser (memcache, text, admin HTTP), whatever its
protocol: how many bytes it holds, whether it has stopped, and the unparsed bytes a connection
handed to another process carries along.  Each parser keeps the bytes fed and not consumed in
`_buf` and its state in `_state`, and names the state values that mean "stopped" and "between
requests".  Those fields are declared here, once, so that where the parsers are compiled
(setup.py) stream.pxd can give them C types; a subclass must not declare them again."""
from __future__ import annotations

# COMPILED: True in the compiled build (setup.py), where the C helpers of stream.pxd replace
# the Python expressions beside them (they exist only there, so only a COMPILED branch names
# them); False in pure Python.  A C constant there (stream.pxd), tested at no cost.
try:
    import cython
    COMPILED = cython.compiled
except ImportError:             # pure Python without Cython installed
    COMPILED = False

#: What `_take_line` answers for a line longer than the parser's max_line.
TOO_LONG = object()


class StreamParser:
    """A subclass sets BETWEEN (the state between two requests, where a handoff may happen) and
    STOPPED (the state after the last request it will ever yield) as class attributes."""
    __slots__ = ("max_line", "_buf", "_scan", "_state")

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

    def _take_line(self):
        """The next line of a line-based protocol (memcache, text), removed from `_buf` without
        its LF and one CR right before it; None when its LF has not arrived; TOO_LONG when it
        is longer than `max_line` bytes, which is known before its LF arrives, so no line is
        buffered beyond the bound.  `_scan` remembers how far `_buf` holds no LF, so feeding a
        long line byte by byte stays linear."""
        buf = self._buf
        if COMPILED:
            i = _c_find(buf, self._scan, 10)        # memchr: no method call, no argument parsing
        else:
            i = buf.find(b"\n", self._scan)
        if i < 0:
            if len(buf) > self.max_line + 1:  # + 1: room for the CR of CRLF
                return TOO_LONG
            self._scan = len(buf)
            return None
        self._scan = 0
        end = i - 1 if i and buf[i - 1] == 13 else i
        if end > self.max_line:
            return TOO_LONG
        line = _c_head(buf, end) if COMPILED else bytes(buf[:end])      # one copy, not two
        del buf[:i + 1]
        return line
