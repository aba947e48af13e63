"""Where the perf suite may write: next to its sources when that folder is writable (a checkout),
else a fallback the caller names (an installed, read-only package)."""
from __future__ import annotations

import os
from pathlib import Path


def writable(here: Path) -> bool:
    """Create `here` if it is missing; whether this user may write in it."""
    try:
        here.mkdir(exist_ok=True)
        return os.access(here, os.W_OK)
    except OSError:
        return False
