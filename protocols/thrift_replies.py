"""Kestrel's thrift replies: the framed TBinaryProtocol REPLY and EXCEPTION messages.

Pure: reply values in, bytes out.  The wire shape (strict headers, the finagle TTwitter
`ResponseHeader` in front of every frame of an upgraded connection) is thrift.py's module
docstring; the constants and struct packers are thrift_wire.py's, shared with the readers, so
reader and writer cannot drift apart.
"""
from __future__ import annotations

import struct

from lanner.protocols.thrift import METHODS, UPGRADE_METHOD, Call, QueueInfo
from lanner.protocols.thrift_wire import (
    _CONTAINER, _FIELD, _I32, _I64, _U32, _VERSION_1, EXCEPTION, REPLY, T_I32, T_I64, T_LIST,
    T_STOP, T_STRING, T_STRUCT,
)

__all__ = ["encode_upgrade_reply", "encode_reply", "encode_exception", "internal_error"]


def _w_string(raw: bytes) -> bytes:
    return _I32.pack(len(raw)) + raw


def _message_head(name: str, mtype: int) -> bytes:
    return _U32.pack(_VERSION_1 | mtype) + _w_string(name.encode("utf-8"))


_REPLY_HEAD = {m: _message_head(m, REPLY) for m in METHODS}
_UPGRADE_REPLY = _message_head(UPGRADE_METHOD, REPLY) + _I32.pack(0) + b"\x00"
_UPGRADE_FRAME = _I32.pack(len(_UPGRADE_REPLY)) + _UPGRADE_REPLY
_EMPTY_RESPONSE_HEADER = b"\x00"   # ResponseHeader with `spans` unset, as finagle writes it
_STOP = b"\x00"
_F0_I32 = _FIELD.pack(T_I32, 0)
_F0_LIST = _FIELD.pack(T_LIST, 0)
_F0_STRUCT = _FIELD.pack(T_STRUCT, 0)
_F0_STRING = _FIELD.pack(T_STRING, 0)
_ITEM_DATA = _FIELD.pack(T_STRING, 1)
_ITEM_ID = _FIELD.pack(T_I64, 2)
_VOID_METHODS = frozenset(("flush_queue", "flush_all_queues", "delete_queue", "set_status"))
_I32_METHODS = frozenset(("put", "confirm", "abort", "current_status"))


def _frame(parts: list[bytes], upgraded: bool) -> bytes:
    if upgraded:
        parts.insert(0, _EMPTY_RESPONSE_HEADER)
    body = b"".join(parts)
    return _I32.pack(len(body)) + body


def encode_upgrade_reply(seqid: int) -> bytes:
    """The framed upgrade REPLY.  Finagle always answers with seqid 0, whatever the call's seqid
    was (§3.1), and finagle clients accept exactly that, so `seqid` is deliberately unused."""
    return _UPGRADE_FRAME


def _encode_items(items) -> list[bytes]:
    parts = [_F0_LIST, _CONTAINER.pack(T_STRUCT, len(items))]
    append = parts.append
    pack_i32, pack_i64 = _I32.pack, _I64.pack
    for item in items:
        data = item.data
        append(_ITEM_DATA + pack_i32(len(data)))
        append(data)
        append(_ITEM_ID + pack_i64(item.id) + _STOP)
    return parts


def _encode_queue_info(info: QueueInfo) -> bytes:
    parts = [_F0_STRUCT]
    if info.head_item is not None:
        parts.append(_FIELD.pack(T_STRING, 1) + _w_string(info.head_item))
    parts.append(struct.pack(">bhqbhqbhqbhqbhibhib",
                             T_I64, 2, info.items, T_I64, 3, info.bytes,
                             T_I64, 4, info.journal_bytes, T_I64, 5, info.age,
                             T_I32, 6, info.waiters, T_I32, 7, info.open_transactions, T_STOP))
    return b"".join(parts)


def encode_reply(call: Call, value, upgraded: bool) -> bytes:
    """The framed REPLY to `call`; `value` has the method's result type (None for void)."""
    method = call.method
    parts = [_REPLY_HEAD[method], _I32.pack(call.seqid)]
    if method in _VOID_METHODS:
        pass
    elif method in _I32_METHODS:
        parts.append(_F0_I32 + _I32.pack(value))
    elif method == "get":
        parts.extend(_encode_items(value))
    elif method == "peek":
        parts.append(_encode_queue_info(value))
    else:  # get_version
        parts.append(_F0_STRING + _w_string(value.encode("utf-8")))
    parts.append(_STOP)
    return _frame(parts, upgraded)


def encode_exception(method: str, seqid: int, exc_type: int, message: str, upgraded: bool) -> bytes:
    """A framed EXCEPTION message carrying TApplicationException{1: message, 2: type}."""
    parts = [_message_head(method, EXCEPTION), _I32.pack(seqid),
             _FIELD.pack(T_STRING, 1), _w_string(message.encode("utf-8")),
             _FIELD.pack(T_I32, 2), _I32.pack(exc_type), _STOP]
    return _frame(parts, upgraded)


def internal_error(method: str, java_exception: str) -> str:
    """Scrooge's message for a handler failure, e.g. `internal_error("put",
    "net.lag.kestrel.AvailabilityException: Server not available for operation setItem")`."""
    return f"Internal error processing {method}: '{java_exception}'"
