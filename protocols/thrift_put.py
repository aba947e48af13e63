"""A `put` call's argument struct decoded as its frame arrives, so that an item no queue would
take is dropped as it comes instead of held until the frame is complete (oversized.py).

Only the parser (thrift.py) starts one, for a put frame larger than its `stream_over` whose
message header has arrived; smaller frames, and every other method, are decoded whole.  The
decoding is thrift.py's `_read_args` for put, step for step: the same fields in whatever order
and as often as they come (the last one wins), unknown ids and unexpected types skipped, the
same checks at the same offsets with the same texts (thrift_wire.py), and the bytes after the
struct's STOP ignored.  So a frame's outcome is the one the whole-frame decoder gives, whatever
way its bytes are cut, with one difference: an item longer than `bound(queue)` is an
`Oversized(size)` in the items list, not its bytes.  `bound(queue)` is the largest item the put
could store anywhere (the front's rule, fronts/putbound.py); `queue` is None while the items
come before the queue_name field.  A queue_name field repeated after the items with a larger
bound cannot bring dropped bytes back: those items stay refused.

What is held meanwhile: the bytes not yet decoded (at most what one read brought), the queue
name, and the items kept so far (each within the bound).  Nothing is acted on before the
frame's last byte is in: the parser yields its outcome only then.

Mechanics: the decoder is a generator over the parser's own buffer.  It consumes bytes from the
buffer's front as it decodes them, and when it needs more it yields how many: n > 0, "resume me
once the buffer holds n bytes"; n < 0, "drop the next -n bytes as they come, then resume me".
"""
from __future__ import annotations

from lanner.protocols.oversized import Oversized
from lanner.protocols.thrift_wire import (
    _CONTAINER, _FIELD, _FIXED, _I32, _MAP, _MAX_DEPTH, _VARIABLE, T_I32, T_LIST, T_MAP, T_SET,
    T_STOP, T_STRING, T_STRUCT, _Bad, cut_field_header, in_field, negative_length,
    negative_size, no_stop, not_a_binary_list, too_deep, truncated, truncated_string,
    unknown_element, unknown_type,
)

__all__ = ["PutStream"]


class PutStream:
    """The rest of one put frame; `step()` after every feed."""

    __slots__ = ("buf", "pos", "flen", "fields", "args", "bound", "kept", "want", "_gen")

    def __init__(self, buf: bytearray, pos: int, flen: int, args: dict, fields: dict, bound):
        """`buf`: the parser's buffer, whose first byte is byte `pos` of the `flen`-byte frame
        (the first of the argument struct); `args`: the IDL defaults, filled in as fields come;
        `fields`: put's {field id: (ttype, key, reader)} (thrift.py's table)."""
        self.buf = buf
        self.pos = pos
        self.flen = flen
        self.args = args
        self.fields = fields
        self.bound = bound
        self.kept = 0                   # bytes of the items kept so far
        self.want = 0
        self._gen = self._run()

    def step(self) -> dict | _Bad | None:
        """Decode what the buffer holds: None until the frame's last byte is in, then the
        arguments (the struct decoded) or why they could not be decoded."""
        buf = self.buf
        while True:
            want = self.want
            if want < 0:
                have = len(buf)
                if have < -want:
                    del buf[:]
                    self.want = want + have
                    return None
                del buf[:-want]
                self.want = 0
            elif len(buf) < want:
                return None
            try:
                self.want = self._gen.send(None)
            except StopIteration as done:
                return done.value

    # -- the decoder (generators: see the module docstring) ----------------------------------------
    def _run(self):
        try:
            out = yield from self._args()
        except _Bad as e:
            out = e
        yield from self._drop(self.flen - self.pos)      # after the STOP, or after the error
        return out

    def _drop(self, n: int):
        buf = self.buf
        self.pos += n
        have = len(buf)
        if have >= n:
            del buf[:n]
            return
        del buf[:]
        yield have - n

    def _args(self):
        buf, flen, args, fields = self.buf, self.flen, self.args, self.fields
        queue = None
        while True:
            pos = self.pos
            if pos >= flen:
                raise no_stop("put", pos)
            if not buf:
                yield 1
            if buf[0] == T_STOP:
                del buf[:1]
                self.pos = pos + 1
                return args
            if pos + 3 > flen:
                raise cut_field_header("put", pos)
            if len(buf) < 3:
                yield 3
            ftype, fid = _FIELD.unpack_from(buf, 0)
            del buf[:3]
            pos = self.pos = pos + 3
            spec = fields.get(fid)
            key = spec[1] if spec is not None and spec[0] == ftype else None
            try:
                if key is None:
                    yield from self._skip(ftype, 1)
                elif ftype == T_STRING:
                    queue = args[key] = (yield from self._binary()).decode("latin-1")
                elif ftype == T_LIST:
                    args[key] = yield from self._items(self.bound(queue))
                elif ftype == T_I32:
                    if pos + 4 > flen:
                        raise truncated(4, pos, flen)
                    if len(buf) < 4:
                        yield 4
                    args[key] = _I32.unpack_from(buf, 0)[0]
                    del buf[:4]
                    self.pos = pos + 4
                else:                    # put's table names no other type
                    raise AssertionError(f"put field {fid} of type {ftype}")
            except _Bad as e:
                raise in_field("put", fid, key, e) from None

    def _length(self):
        """A string's 4-byte length, checked against the frame as thrift.py checks it: how many
        bytes follow it (the length itself stays in `buf`)."""
        buf, flen, pos = self.buf, self.flen, self.pos
        if pos + 4 > flen:
            raise truncated(4, pos, flen)
        if len(buf) < 4:
            yield 4
        n = _I32.unpack_from(buf, 0)[0]
        if n < 0:
            raise negative_length(n, pos)
        if pos + 4 + n > flen:
            raise truncated_string(n, pos + 4, flen)
        return n

    def _binary(self):
        n = yield from self._length()
        buf = self.buf
        if len(buf) < 4 + n:
            yield 4 + n
        raw = bytes(buf[4:4 + n])
        del buf[:4 + n]
        self.pos += 4 + n
        return raw

    def _list_head(self):
        """A list's or set's header, checked against the frame and consumed: (element type,
        count)."""
        buf, flen, pos = self.buf, self.flen, self.pos
        if pos + 5 > flen:
            raise truncated(5, pos, flen)
        if len(buf) < 5:
            yield 5
        etype, n = _CONTAINER.unpack_from(buf, 0)
        if n < 0:
            raise negative_size(n, pos)
        yield from self._drop(5)
        return etype, n

    def _items(self, bound: int):
        """list<binary>: each item within `bound` kept, each over it dropped as it arrives."""
        buf = self.buf
        etype, n = yield from self._list_head()
        if n and etype != T_STRING:
            raise not_a_binary_list(etype)
        out = []
        append = out.append
        i = 0
        while i < n:                    # each item takes >= 4 bytes: bounded by the frame
            i += self._kept_run(n - i, bound, append)
            if i == n:
                break
            i += 1
            size = yield from self._length()
            if size > bound:
                del buf[:4]
                self.pos += 4
                yield from self._drop(size)
                append(Oversized(size))
            else:
                if len(buf) < 4 + size:
                    yield 4 + size
                with memoryview(buf) as view:         # one copy, not two
                    append(bytes(view[4:4 + size]))
                del buf[:4 + size]
                self.pos += 4 + size
                self.kept += size
        return out

    def _kept_run(self, most: int, bound: int, append) -> int:
        """The items (at most `most`) the buffer already holds whole and within `bound`, taken
        in one go, with one deletion from the buffer: how many.  It stops before any other
        item (not all in, over the bound, or wrong), which `_items` then takes one by one and
        words any error for."""
        buf, flen, pos = self.buf, self.flen, self.pos
        have = len(buf)
        end = min(have, flen - pos)     # (the buffer may hold the next frame's bytes too)
        at = done = 0
        unpack = _I32.unpack_from
        with memoryview(buf) as view:
            while done < most and at + 4 <= end:
                size = unpack(view, at)[0]
                if size < 0 or size > bound or at + 4 + size > end:
                    break
                append(bytes(view[at + 4:at + 4 + size]))
                at += 4 + size
                done += 1
        if at:
            del buf[:at]
            self.pos = pos + at
            self.kept += at - 4 * done
        return done

    def _skip(self, ttype: int, depth: int):
        """Step over one value of `ttype`, dropping it as it arrives (thrift.py `_skip`)."""
        buf, flen, pos = self.buf, self.flen, self.pos
        width = _FIXED.get(ttype)
        if width is not None:
            if pos + width > flen:
                raise truncated(width, pos, flen)
            yield from self._drop(width)
            return
        if ttype == T_STRING:
            n = yield from self._length()
            yield from self._drop(4 + n)
            return
        if depth >= _MAX_DEPTH:
            raise too_deep(pos)
        if ttype == T_STRUCT:
            while True:
                pos = self.pos
                if pos + 1 > flen:
                    raise truncated(1, pos, flen)
                if not buf:
                    yield 1
                ftype = buf[0]           # unsigned here, as the whole-frame _skip reads it
                if ftype == T_STOP:
                    yield from self._drop(1)
                    return
                if pos + 3 > flen:
                    raise truncated(3, pos, flen)
                yield from self._drop(3)
                yield from self._skip(ftype, depth + 1)
        if ttype in (T_LIST, T_SET):
            etype, n = yield from self._list_head()
            yield from self._skip_run(n, (etype,), depth)
            return
        if ttype == T_MAP:
            if pos + 6 > flen:
                raise truncated(6, pos, flen)
            if len(buf) < 6:
                yield 6
            ktype, vtype, n = _MAP.unpack_from(buf, 0)
            if n < 0:
                raise negative_size(n, pos)
            yield from self._drop(6)
            yield from self._skip_run(n, (ktype, vtype), depth)
            return
        raise unknown_type(ttype, pos)

    def _skip_run(self, n: int, types: tuple[int, ...], depth: int):
        if not n:
            return
        widths = [_FIXED.get(t) for t in types]
        if None not in widths:
            total = n * sum(widths)
            if self.pos + total > self.flen:
                raise truncated(total, self.pos, self.flen)
            yield from self._drop(total)
            return
        for t in types:
            if t not in _FIXED and t not in _VARIABLE:
                raise unknown_element(t, self.pos)
        for _ in range(n):
            for t in types:
                yield from self._skip(t, depth + 1)
