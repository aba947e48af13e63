"""What a put item becomes when the parser drops its bytes as they arrive.

A thrift put frame (thrift_put.py) or a text put block (text.py) may carry an item larger than
any queue the put can reach would take: Kestrel refuses it there (reference §5.3, `len(data) >
maxItemSize`), and the put's result says so (thrift: the count stops before it, §3.3; text: it
is not counted, §2.2).  Holding its bytes until the request is complete only to have them
refused let one connection pin up to a whole frame or block of memory, so the parser counts
them and drops them, and the item travels on as its size alone, in its place among the others:
the front asks the owning worker to refuse it where the bytes would have been refused
(fronts/thrift.py, fronts/text.py), so every result and side effect stays what it was.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Oversized"]


@dataclass(slots=True, frozen=True)
class Oversized:
    """A put item of `size` bytes whose bytes were dropped unread."""
    size: int
