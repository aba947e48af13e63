"""What a queue's add and remove read of its config per request, kept on the queue itself.

A QueueConfig is a Python object: from the compiled queue (queue.pxd) each read of one of its
fields is a generic attribute lookup, several a request.  The queue keeps copies of those
fields in C fields of its own (`_floor`, `_max_age`, `_max_memory`, `_fanout_only`), taken from
the config in `_limits_of` (`_max_memory` a C integer: at most LONG_MAX, which no queue's
bytes reach); add and remove take them again whenever `config` is another object
(a reload, or a test that sets `config`), so the limits in force are always the config's."""
from __future__ import annotations

from lanner.config_values import LONG_MAX

#: Above this an int is two digits, and comparing it is a generic call (3.11 specialises
#: compares of one-digit ints only): the limits' defaults (INT_MAX, LONG_MAX) are bigger.
_ONE_DIGIT = (1 << 30) - 1


def limit_floor(config) -> int:
    """A one-digit int no limit an add checks is below: whatever is under it passes them all."""
    return min(config.max_items, config.max_size, config.max_item_size, _ONE_DIGIT)


def adopt_limits(q, config) -> None:
    """Take the fields of `config` that add and remove read per request onto queue `q`."""
    q._floor, q._max_age, q._max_memory, q._fanout_only = (
        limit_floor(config), config.max_age, min(config.max_memory_size, LONG_MAX), config.fanout_only)
    q._limits_of = config
