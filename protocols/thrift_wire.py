"""TBinaryProtocol's pieces that thrift.py (whole frames), thrift_put.py (a put frame streamed)
and thrift_replies.py (the replies) share: type codes, packers, and the texts a decode stops
with.  The two decoders must stop on the same bytes with the same words, whatever way a frame
arrived, so each text is made in one place: here.
"""
from __future__ import annotations

import struct

# message types
CALL, REPLY, EXCEPTION, ONEWAY = 1, 2, 3, 4
# TTypes
T_STOP, T_VOID, T_BOOL, T_BYTE, T_DOUBLE = 0, 1, 2, 3, 4
T_I16, T_I32, T_I64, T_STRING, T_STRUCT, T_MAP, T_SET, T_LIST = 6, 8, 10, 11, 12, 13, 14, 15

_VERSION_1 = 0x80010000
_VERSION_MASK = 0xFFFF0000
_MAX_DEPTH = 64
_FIXED = {T_BOOL: 1, T_BYTE: 1, T_DOUBLE: 8, T_I16: 2, T_I32: 4, T_I64: 8}
#: the types a container may hold besides the fixed-width ones
_VARIABLE = (T_STRING, T_STRUCT, T_MAP, T_SET, T_LIST)
_TYPE_NAMES = {T_STOP: "stop", T_VOID: "void", T_BOOL: "bool", T_BYTE: "byte", T_DOUBLE: "double",
               T_I16: "i16", T_I32: "i32", T_I64: "i64", T_STRING: "string", T_STRUCT: "struct",
               T_MAP: "map", T_SET: "set", T_LIST: "list"}

_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_FIELD = struct.Struct(">bh")        # field header: type byte, i16 id
_CONTAINER = struct.Struct(">bi")    # list/set header: element type, i32 size
_MAP = struct.Struct(">bbi")         # map header: key type, value type, i32 size


class _Bad(Exception):
    """Decoding stopped; the message says where, for the exception or close reason."""


def _type_name(t: int) -> str:
    return _TYPE_NAMES.get(t, f"type {t}")


# --------------------------------------------------------------------------- why a decode stopped

def truncated(n: int, pos: int, flen: int) -> _Bad:
    return _Bad(f"frame truncated: {n} bytes needed at offset {pos} of a {flen}-byte frame")


def truncated_string(n: int, pos: int, flen: int) -> _Bad:
    """A string of n bytes, starting at `pos` (after its length), runs past the frame."""
    return _Bad(f"frame truncated: string of {n} bytes at offset {pos} of a {flen}-byte frame")


def negative_length(n: int, pos: int) -> _Bad:
    return _Bad(f"Negative length: {n} (at offset {pos})")


def negative_size(n: int, pos: int) -> _Bad:
    return _Bad(f"Negative container size: {n} (at offset {pos})")


def too_deep(pos: int) -> _Bad:
    return _Bad(f"nesting deeper than {_MAX_DEPTH} levels at offset {pos}")


def unknown_type(t: int, pos: int) -> _Bad:
    return _Bad(f"unknown thrift type {t} at offset {pos}")


def unknown_element(t: int, pos: int) -> _Bad:
    return _Bad(f"unknown thrift element type {t} at offset {pos}")


def not_a_binary_list(etype: int) -> _Bad:
    return _Bad(f"list<{_type_name(etype)}> where list<binary> was expected")


def no_stop(method: str, pos: int) -> _Bad:
    return _Bad(f"{method}_args: frame ends before the struct's STOP (offset {pos})")


def cut_field_header(method: str, pos: int) -> _Bad:
    return _Bad(f"{method}_args: frame truncated in a field header at offset {pos}")


def in_field(method: str, fid: int, key: str | None, e: _Bad) -> _Bad:
    """`e` raised reading argument `fid` (`key` its name when it is a known one, else None)."""
    if key is None:
        return _Bad(f"{method}_args field {fid}: {e}")
    return _Bad(f"{method}_args field {fid} ({key}): {e}")
