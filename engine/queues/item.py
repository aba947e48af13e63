"""The queue item, as Kestrel's QItem, plus the fields a workq job carries.

Written out rather than made by @dataclass: item.pxd makes it a C type in the compiled build
(every add makes one: a C allocation and struct stores, where the slots dataclass cost a
generic setattr per field, ~200 instructions each), which Cython's dataclass support cannot do
with slots.  It keeps the dataclass's surface: the constructor by position and by keyword with
the same defaults, equality by value (unhashable), the repr, `len()`, `__match_args__`."""
from __future__ import annotations

try:                            # COMPILED: as in memcache_commands.py (item.pxd)
    import cython
    COMPILED = cython.compiled
except ImportError:             # pure Python without Cython installed
    COMPILED = False


class QItem:
    __slots__ = __match_args__ = ("add_time", "expiry", "data", "xid", "job_id", "priority")

    def __init__(self, add_time: int, expiry: int, data: bytes, xid: int = 0,
                 job_id: bytes | None = None, priority: int = 0) -> None:
        self.add_time = add_time      # epoch ms when the item was added
        self.expiry = expiry          # epoch ms after which it is expired; 0 = never
        self.data = data
        self.xid = xid                # open-transaction id while reserved, else 0
        self.job_id = job_id          # 16-byte UUID when stored in a workq command log
        self.priority = priority      # workq priority (higher first); always 0 for Kestrel items

    def __len__(self) -> int:
        return len(self.data)

    def _fields(self) -> tuple:
        return (self.add_time, self.expiry, self.data, self.xid, self.job_id, self.priority)

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None

    def __repr__(self) -> str:
        return "QItem(add_time=%r, expiry=%r, data=%r, xid=%r, job_id=%r, priority=%r)" % self._fields()


if COMPILED:
    # interpreted readers (the codec, read-behind, the cmdlog, tests) read the fields as member
    # descriptors, LOAD_ATTR_SLOT, as the `__slots__` of the pure-Python build (memcache_commands.pxd)
    _c_slot_fields(QItem, QItem.__slots__)
