"""What a front relies on in every incremental parser (memcache, text, admin HTTP), whatever its
protocol: how many bytes it holds, whether it has stopped, and the unparsed bytes a connection
handed to another process carries along.  Each parser keeps the bytes fed and not consumed in
`_buf[_pos:]` and its state in `_state`, and names the state values that mean "stopped" and
"between requests".  Those fields are declared here, once, so that where the parsers are
compiled (setup.py) stream.pxd can give them C types; a subclass must not declare them again.

The buffer (issue 8, "the parser's buffer work"): taking a command advances the read offset
`_pos`; nothing is moved.  Deleting each command from the front of a bytearray made CPython
reallocate and copy the rest, per command.  `feed` is where the buffer changes (`joined`, which
thrift.py's parser follows too):

* nothing unconsumed (the common case, every request whole in its read): the parser reads the
  fed `bytes` themselves, in place (bytes never change: no copy);
* else the unconsumed tail moves to the front of a bytearray once, and the new bytes join it.

Once a command consumes the last byte held, the buffer is let go (`_consumed`), so an idle
connection pins no read, as before when each command was deleted from it."""
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
    STOPPED (the state after the last request it will ever yield) as class attributes, and
    starts with `_reset()`."""
    __slots__ = ("max_line", "_buf", "_pos", "_scan", "_state")

    @property
    def buffered(self) -> int:
        """Bytes held and not yet parsed (the front can watch this for back-pressure)."""
        return len(self._buf) - self._pos

    @property
    def stopped(self) -> bool:
        """True once a request that closes the connection (or an error that does) was yielded."""
        return self._state == self.STOPPED

    def unparsed(self) -> bytes | None:
        """The bytes fed and not parsed yet, when a fresh parser fed them would continue exactly
        where this one stands (between requests); None inside a request's data.  A connection
        handed to another process carries them along."""
        return bytes(self._buf[self._pos:]) if self._state == self.BETWEEN else None

    def _reset(self) -> None:
        """Hold nothing: the buffer let go (an empty bytes, never written to)."""
        self._buf = b""
        self._pos = 0
        self._scan = 0

    def _append(self, data) -> None:
        """`data` joins the bytes not consumed yet (`joined`)."""
        pos = self._pos
        self._buf = joined(self._buf, pos, data)
        self._scan -= pos
        self._pos = 0

    def _consumed(self, pos: int) -> None:
        """Everything before `pos` is taken; past the last byte held, the buffer is let go."""
        if pos == len(self._buf):
            self._buf = b""
            self._pos = self._scan = 0
        else:
            self._pos = self._scan = pos

    def _line_end(self) -> int:
        """Where the next line's LF is in `_buf`; -1 when it has not arrived, -2 when the line
        is longer than `max_line` bytes (its LF and one CR right before it not counted), which
        is known before its LF arrives, so no line is buffered beyond the bound.  `_scan`
        (>= `_pos`) remembers how far `_buf` holds no LF, so feeding a long line byte by byte
        stays linear."""
        buf = self._buf
        pos = self._pos
        if COMPILED:
            i = _c_find(buf, self._scan, 10)        # memchr: no method call, no argument parsing
        else:
            i = buf.find(b"\n", self._scan)
        if i < 0:
            n = len(buf)
            if n - pos > self.max_line + 1:  # + 1: room for the CR of CRLF
                return -2
            self._scan = n
            return -1
        if i - pos > self.max_line and (i - pos > self.max_line + 1 or self._before(i) != 13):
            return -2
        return i

    def _before(self, i: int) -> int:
        """The byte before index `i` of `_buf` (i > `_pos`); -1 at `_pos`: whether a line
        ending in LF at `i` also drops a CR."""
        if i <= self._pos:
            return -1
        if COMPILED:
            return _c_byte(self._buf, i - 1)
        return self._buf[i - 1]

    def _take_line(self):
        """The next line of a line-based protocol (memcache, text), consumed without its LF and
        one CR right before it; None when its LF has not arrived; TOO_LONG past `max_line`
        (`_line_end`)."""
        i = self._line_end()
        if i < 0:
            return None if i == -1 else TOO_LONG
        pos = self._pos
        end = i - 1 if self._before(i) == 13 else i
        line = _c_slice(self._buf, pos, end - pos) if COMPILED else bytes(self._buf[pos:end])
        self._consumed(i + 1)
        return line

def joined(buf, pos: int, data):
    """A buffer holding `buf[pos:]` and then `data`, for a parser to read from its offset 0: the
    policy of every parser's `feed` (module docstring).  Nothing left (`pos == len(buf)`):
    `data` itself when it is bytes (immutable: read in place, no copy).  Else the tail of a
    read taken in place starts a bytearray, or the bytearray drops its consumed head (one
    move per feed, not per command), and `data` is appended."""
    if pos == len(buf):
        return data if type(data) is bytes else bytes(data)   # a bytearray or view may change
    if type(buf) is bytes:
        buf = _c_tail(buf, pos) if COMPILED else bytearray(memoryview(buf)[pos:])
    elif pos:
        del buf[:pos]
    buf += data
    return buf
