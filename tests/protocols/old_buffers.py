"""The parsers' buffer work as it was before the read offset (main at 2ba7774): every command
deleted from the front of a bytearray (`del buf[:n]`), every feed appended to it.  Only the
methods that touched the buffer are kept here, verbatim but for the compiled-only branches
(their pure-Python twins were always the same bytes); the parsing itself is the parsers' own,
inherited.  tests/protocols/test_buffer_equivalence.py feeds these and today's parsers the same
byte streams cut at random points and asserts the same outcomes."""
from __future__ import annotations

from lanner.protocols import admin as ad
from lanner.protocols import memcache as mc
from lanner.protocols import text as tx
from lanner.protocols import thrift as th
from lanner.protocols.memcache import STREAM_PIECE, ProtocolError, SetPiece
from lanner.protocols.memcache_replies import client_error
from lanner.protocols.oversized import Oversized
from lanner.protocols.stream import TOO_LONG
from lanner.protocols.thrift_put import PutStream

_LINE, _DATA, _SKIP, _STOPPED, _BODY = 0, 1, 2, 3, 4       # memcache.py's states


def _old_buffered(self):
    return len(self._buf)


def _old_unparsed(self):
    return bytes(self._buf) if self._state == self.BETWEEN else None


def _old_take_line(self):
    buf = self._buf
    i = buf.find(b"\n", self._scan)
    if i < 0:
        if len(buf) > self.max_line + 1:
            return TOO_LONG
        self._scan = len(buf)
        return None
    self._scan = 0
    end = i - 1 if i and buf[i - 1] == 13 else i
    if end > self.max_line:
        return TOO_LONG
    line = bytes(buf[:end])
    del buf[:i + 1]
    return line


class OldMemcacheParser(mc.MemcacheParser):
    buffered = property(_old_buffered)
    unparsed = _old_unparsed
    _take_line = _old_take_line

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._buf = bytearray()
        self._direct = None

    def feed(self, data: bytes) -> None:
        state = self._state
        if state == _BODY:
            if self._direct is None and not self._buf and len(data) >= STREAM_PIECE:
                self._direct = data
                return
            if self._direct is not None:
                self._buf += self._direct
                self._direct = None
        if state == _SKIP and not self._buf:
            n = len(data)
            need = self._need
            if n <= need:
                self._need = need - n
                return
            self._need = 0
            self._buf += memoryview(data)[need:]
            return
        if state == _STOPPED:
            return
        self._buf += data

    def next(self):
        buf = self._buf
        while True:
            state = self._state
            if state == _LINE:
                if not self._scan and buf and buf[0] == 0x80:
                    return self._stop(ProtocolError(client_error(
                        "the memcache binary protocol is not supported; use the text protocol"), True))
                line = self._take_line()
                if line is None:
                    return None
                if line is TOO_LONG:
                    return self._stop(ProtocolError(
                        client_error("line longer than %d bytes" % self.max_line), True))
                cmd = self._line(line)
                if cmd is not None:
                    return cmd
            elif state == _DATA:
                need = self._need
                if len(buf) < need:
                    return None
                cmd = self._set
                cmd.data = bytes(buf[:need - 2])
                del buf[:need]
                self._set = None
                self._state = _LINE
                return cmd
            elif state == _BODY:
                need = self._need
                piece = self._direct
                if piece is not None:
                    self._direct = None
                    if len(piece) > need:
                        buf += memoryview(piece)[need:]
                        piece = piece[:need]
                else:
                    n = len(buf)
                    if n < need and n < STREAM_PIECE:
                        return None
                    if n <= need:
                        piece = bytes(buf)
                        buf.clear()
                    else:
                        piece = bytes(buf[:need])
                        del buf[:need]
                self._need = need - len(piece)
                if self._need:
                    return SetPiece(piece, False)
                self._skip(2, None)
                return SetPiece(piece, True)
            elif state == _SKIP:
                n = self._need
                if n:
                    if len(buf) < n:
                        self._need = n - len(buf)
                        buf.clear()
                        return None
                    del buf[:n]
                    self._need = 0
                self._state = _LINE
                cmd, self._after = self._after, None
                if cmd is not None:
                    if type(cmd) is ProtocolError and cmd.close:
                        return self._stop(cmd)
                    return cmd
            else:
                return None

    def _stop(self, cmd):
        self._state = _STOPPED
        self._buf.clear()
        self._set = self._after = None
        return cmd


class OldTextParser(tx.TextParser):
    unparsed = _old_unparsed
    _take_line = _old_take_line

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf) + self._kept

    def feed(self, data: bytes) -> None:
        if self._state != tx._STOPPED:
            self._buf += data

    def _take_item(self):
        if self._skipped >= 0:
            return self._skip_rest()
        line = self._take_line()
        if self.item_limit is None:
            return line
        if line is None:
            buf = self._buf
            if len(buf) > self.skip_over + 1 and len(buf) > self._item_bound() + 1:
                self._skipped = len(buf)
                self._skip_cr = buf[-1] == 13
                del buf[:]
                self._scan = 0
                return self._skip_rest()
            return None
        if line is not TOO_LONG and len(line) > self.skip_over and len(line) > self._item_bound():
            return Oversized(len(line))
        return line

    def _skip_rest(self):
        buf = self._buf
        i = buf.find(b"\n")
        if i < 0:
            if buf:
                self._skipped += len(buf)
                self._skip_cr = buf[-1] == 13
                del buf[:]
            if self._skipped > self.max_line + 1:
                self._skipped = -1
                return TOO_LONG
            return None
        cr = buf[i - 1] == 13 if i else self._skip_cr
        size = self._skipped + i - cr
        del buf[:i + 1]
        self._skipped = -1
        return TOO_LONG if size > self.max_line else Oversized(size)

    def _stop(self, cmd):
        self._end_block()
        self._state = tx._STOPPED
        self._buf.clear()
        return cmd


class OldAdminParser(ad.AdminParser):
    buffered = property(_old_buffered)
    unparsed = _old_unparsed

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        if self._state != ad._STOPPED:
            self._buf += data

    def next(self):
        buf = self._buf
        while True:
            if self._state == ad._BODY:
                n = min(self._skip, len(buf))
                del buf[:n]
                self._skip -= n
                if self._skip:
                    return None
                self._state = ad._HEAD
                req, self._pending = self._pending, None
                return self._done(req)
            if self._state == ad._STOPPED:
                return None
            while buf[:2] == b"\r\n" or buf[:1] == b"\n":
                del buf[:2 if buf[:1] == b"\r" else 1]
                self._scan = 0
            end = buf.find(b"\n\r\n", max(0, self._scan - 2))
            lf_end = buf.find(b"\n\n", max(0, self._scan - 1))
            if end < 0 and lf_end < 0:
                if len(buf) > self.max_head:
                    return self._stop(ad._http_error(431, "request head longer than %d bytes" % self.max_head))
                self._scan = len(buf)
                return None
            if end < 0 or (0 <= lf_end < end):
                head_len, cut = lf_end + 1, lf_end + 2
            else:
                head_len, cut = end + 1, end + 3
            self._scan = 0
            if head_len > self.max_head:
                return self._stop(ad._http_error(431, "request head longer than %d bytes" % self.max_head))
            head = bytes(buf[:head_len])
            del buf[:cut]
            result = self._parse_head(head)
            if type(result) is ad.HttpError:
                return self._stop(result)
            req, length = result
            if length:
                self._state = ad._BODY
                self._skip = length
                self._pending = req
                continue
            return self._done(req)

    def _stop(self, result):
        self._state = ad._STOPPED
        self._buf.clear()
        self._pending = None
        return result


class OldThriftParser(th.ThriftParser):
    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def held(self) -> int:
        return len(self._buf) + (self._put.kept if self._put is not None else 0)

    def feed(self, data: bytes) -> None:
        if not self._stopped:
            self._buf += data

    def next(self):
        if self._stopped:
            return None
        if self._put is not None:
            return self._streamed()
        buf = self._buf
        if len(buf) < 4:
            return None
        n = th._I32.unpack_from(buf, 0)[0]
        if n < 0 or n > self.max_frame:
            return self._stop(f"frame length {n} outside 0..{self.max_frame}")
        end = 4 + n
        if len(buf) < end:
            if n > self.stream_over and self.item_limit is not None and not self._whole:
                return self._start_put(n)
            return None
        self._whole = False
        self._tried = 0
        with memoryview(buf) as view:
            frame = bytes(view[4:end])
        del buf[:end]
        return self._decode(frame)

    def _start_put(self, n: int):
        buf = self._buf
        have = len(buf) - 4
        if have < self._tried:
            return None
        self._tried = 2 * have
        head = bytes(buf[4:4 + min(have, th._HEAD_MAX)])
        try:
            client_id, pos = th._read_request_header(head, 0) if self.upgraded else (None, 0)
            name, _, seqid, pos = th._read_message_begin(head, pos)
        except th._Bad:
            self._whole = have >= th._HEAD_MAX
            return None
        if name != "put":
            self._whole = True
            return None
        del buf[:4 + pos]
        defaults, fields = th._ARGS["put"]
        self._put = PutStream(buf, pos, n, defaults(), fields, self.item_limit)
        self._call = (seqid, client_id)
        return self._streamed()

    def _stop(self, reason: str):
        self._stopped = True
        self._buf = bytearray()
        self._put = self._call = None
        return th.ProtocolError(reason)
