"""A tiny workq segment decoder/encoder written from the spec alone, sharing no
code with lanner.storage.cmdlog.segment (its own CRC-32C table too), so that tests can check
Lanner's bytes against an independent reading of the format."""
from __future__ import annotations

import struct

_POLY = 0x82F63B78
_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def uvarint(data: bytes, pos: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        b = data[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, pos


def put_uvarint(v: int) -> bytes:
    out = bytearray()
    while True:
        if v < 0x80:
            out.append(v)
            return bytes(out)
        out.append(0x80 | (v & 0x7F))
        v >>= 7


def go_time(raw: bytes) -> tuple[int, int, int]:
    assert len(raw) == 15 and raw[0] == 1
    sec, nsec, off = struct.unpack(">qih", raw[1:])
    return sec, nsec, off


def put_go_time(sec: int, nsec: int, off: int = -1) -> bytes:
    return b"\x01" + struct.pack(">qih", sec, nsec, off)


def decode_payload(p: bytes) -> dict:
    t = p[0]
    d = {"type": t, "id": p[1:17]}
    pos = 17
    if t in (1, 2):
        n, pos = uvarint(p, pos)
        d["name"] = p[pos:pos + n]
        pos += n
        d["ttr"], pos = uvarint(p, pos)
        d["ttl"], pos = uvarint(p, pos)
        z, pos = uvarint(p, pos)
        d["priority"] = (z >> 1) if not z & 1 else -((z >> 1) + 1)
        d["max_attempts"], pos = uvarint(p, pos)
        d["max_fails"], pos = uvarint(p, pos)
        n, pos = uvarint(p, pos)
        d["payload"] = p[pos:pos + n]
        pos += n
        d["time"] = go_time(p[pos:pos + 15])
        d["created"] = go_time(p[pos + 15:pos + 30])
        pos += 30
    elif t in (3, 4):
        n, pos = uvarint(p, pos)
        d["result"] = p[pos:pos + n]
        pos += n
    else:
        assert 5 <= t <= 8, t
    assert pos == len(p), "trailing bytes"
    return d


def encode_payload(d: dict) -> bytes:
    out = bytes([d["type"]]) + d["id"]
    t = d["type"]
    if t in (1, 2):
        pr = d["priority"]
        out += (put_uvarint(len(d["name"])) + d["name"] + put_uvarint(d["ttr"]) + put_uvarint(d["ttl"])
                + put_uvarint(pr * 2 if pr >= 0 else -pr * 2 - 1) + put_uvarint(d["max_attempts"])
                + put_uvarint(d["max_fails"]) + put_uvarint(len(d["payload"])) + d["payload"]
                + put_go_time(*d["time"]) + put_go_time(*d["created"]))
    elif t in (3, 4):
        out += put_uvarint(len(d["result"])) + d["result"]
    return out


def read_segment(data: bytes) -> list[dict]:
    """Every record of a segment's bytes: time, size bytes, payload, crc; asserts validity."""
    assert data[:8] == bytes.fromhex("7771777100000001")
    pos = 8
    out = []
    while pos < len(data):
        time_raw = data[pos:pos + 15]
        size, p = uvarint(data, pos + 15)
        size_raw = data[pos + 15:p]
        payload = data[p:p + size]
        crc = struct.unpack(">I", data[p + size:p + size + 4])[0]
        assert crc == crc32c(time_raw + size_raw + payload), f"crc at {pos}"
        out.append({"offset": pos, "time": go_time(time_raw), "time_raw": time_raw, "size_raw": size_raw,
                    "payload": payload, "command": decode_payload(payload)})
        pos = p + size + 4
    assert pos == len(data)
    return out


def write_segment(records: list[dict]) -> bytes:
    """Re-encode from the decoded fields only (not the stored raw bytes)."""
    out = bytearray(bytes.fromhex("7771777100000001"))
    for r in records:
        payload = encode_payload(r["command"])
        body = put_go_time(*r["time"]) + put_uvarint(len(payload)) + payload
        out += body + struct.pack(">I", crc32c(body))
    return bytes(out)
