"""The queue item, as Kestrel's QItem, plus the fields a workq job carries."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class QItem:
    add_time: int          # epoch ms when the item was added
    expiry: int            # epoch ms after which it is expired; 0 = never
    data: bytes
    xid: int = 0           # open-transaction id while reserved, else 0
    job_id: bytes | None = None   # 16-byte UUID when stored in a workq command log
    priority: int = 0      # workq priority (higher first); always 0 for Kestrel items

    def __len__(self) -> int:
        return len(self.data)
