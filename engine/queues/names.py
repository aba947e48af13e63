"""Which queue names Lanner accepts: the one place that decides it.

Fronts check every name a client sends (and answer CLIENT_ERROR with the reason), the config
checks the names in the file, the collection checks again before it creates a queue.  A name is
the raw bytes a client sent, carried as their latin-1 `str`.

A journal-stored queue's name becomes file names under queue_path (storage/journal/journal.py):
`<q>`, `<q>.<ms>`, `<q>.<ms>.pack` and the temporaries `<q>~~<ms>` and `<q>~~<ms>.tmp` (the
packer's output), where `<ms>` is a 13-digit epoch-millisecond stamp (until the year 2286).  The
OS stores a name as `os.fsencode` gives it (UTF-8: a byte 0x80-0xFF a client sent takes two
bytes on disk), and no file name may exceed NAME_MAX (255) bytes.  So:

* the name's on-disk form plus the longest suffix must fit NAME_MAX: at most MAX_FILE_NAME_BYTES
  (236) bytes on disk, i.e. 236 ASCII bytes or 118 bytes of 0x80-0xFF;
* `/`, `\\`, `~` (the temporaries' separator), `.` (the timestamps' separator) and control
  bytes are refused, so no name can address a file outside the queue directory;
* names of entries the server keeps in queue_path itself are reserved (RESERVED: `cmdlog/`
  holds the command logs).

A queue stored in a command log (storage = "cmdlog") never names a file: it may contain `.`
(workq job names do), and only the wire limit of 255 bytes applies.
"""
from __future__ import annotations

import os
import re

__all__ = ["CMDLOG_DIR", "MAX_FILE_NAME_BYTES", "MAX_NAME_BYTES", "RESERVED",
           "validate_queue_name"]

NAME_MAX = 255                  # Linux's limit on one file name, in bytes
MAX_NAME_BYTES = 255            # any name, as the client's bytes
STAMP_DIGITS = 13               # epoch milliseconds until 2286
_SUFFIXES = ("." + "9" * STAMP_DIGITS + ".pack", "~~" + "9" * STAMP_DIGITS + ".tmp")
LONGEST_SUFFIX = max(len(s) for s in _SUFFIXES)
MAX_FILE_NAME_BYTES = NAME_MAX - LONGEST_SUFFIX

CMDLOG_DIR = "cmdlog"           # queue_path/cmdlog/<partition>/ holds the command logs
RESERVED = frozenset({CMDLOG_DIR})

_BAD = re.compile(r"[/\\~\x00-\x1f\x7f]")
_BAD_WITH_DOTS = re.compile(r"[/\\~.\x00-\x1f\x7f]")


def validate_queue_name(name: str, allow_dots: bool = False) -> None:
    """Raise ValueError with a reason (naming no server path) unless `name` can name a queue.
    `allow_dots`: the queue lives in a command log, so its name is never a file name."""
    if not name:
        raise ValueError("Queue name is empty.")
    try:
        size = len(name.encode("latin-1"))
    except UnicodeEncodeError:
        raise ValueError("Queue name is not a byte string (characters above U+00FF).") from None
    if size > MAX_NAME_BYTES:
        raise ValueError(f"Queue name is too long ({size} bytes, at most {MAX_NAME_BYTES}).")
    if (_BAD if allow_dots else _BAD_WITH_DOTS).search(name):
        if allow_dots:
            raise ValueError("Queue name contains illegal characters (one of: ~ / \\ or a control byte).")
        raise ValueError("Queue name contains illegal characters (one of: ~ . / \\ or a control byte).")
    if allow_dots:
        return
    on_disk = len(os.fsencode(name))
    if on_disk > MAX_FILE_NAME_BYTES:
        raise ValueError(
            f"Queue name is too long for a journal file name ({on_disk} bytes on disk, at most "
            f"{MAX_FILE_NAME_BYTES}: bytes 0x80-0xFF take two, and {LONGEST_SUFFIX} are kept for "
            f"the journal's suffixes).")
    if name in RESERVED:
        raise ValueError(f"Queue name {name!r} is reserved: the queue directory's {name}/ holds "
                         "the command logs.")
