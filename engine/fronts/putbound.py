"""The largest put item that could be stored anywhere a put reaches: over it, the thrift and
text parsers drop an item's bytes as they arrive (protocols/oversized.py), and the front has the
owning worker refuse it in its place.

The bound must never be below what some queue the put reaches would accept, or an item that
would have been stored is lost; so it is the largest `max_item_size` of the queue, of every
fanout child it may have (a master's children get their copies before the master's own checks,
collection.py `add`: an unconfigured child takes its master's config, a configured one its own),
and, for an alias, of every destination and theirs.  A queue not known yet (a thrift put whose
items come before its queue name) gets the largest of all.  Asked once per big put frame or
long text line, not per request, so it is computed, not cached.  The front's config decides: a
reload that raises a limit while an item is being dropped leaves that one item refused, as if
the put had come just before the reload.
"""
from __future__ import annotations

import msgpack

from lanner.protocols.oversized import Oversized

from lanner.config import Config

__all__ = ["put_bound", "refusal"]


def put_bound(config: Config, queue: str | None) -> int:
    if queue is None:
        return max([config.default.max_item_size,
                    *(config.queue_config(q).max_item_size for q in config.queue_overrides)])
    dests = config.aliases.get(queue)
    if dests is not None:
        # an alias stores only through its destinations (none: nothing is stored anywhere)
        return max((_queue_bound(config, d) for d in dests), default=0)
    return _queue_bound(config, queue)


def _queue_bound(config: Config, queue: str) -> int:
    bound = config.queue_config(queue).max_item_size
    prefix = queue + "+"
    for name in config.queue_overrides:
        if name.startswith(prefix):
            bound = max(bound, config.queue_config(name).max_item_size)
    return bound


def refusal(item: Oversized) -> bytes:
    """The OP_PUT_MANY payload that has the owning worker refuse `item` where its bytes would
    have been refused (and create the queue, as that add would have)."""
    return msgpack.packb([item.size])
