"""What a client may be told about a failure on the server's side.

Replies never contain server paths (issue 11): an OSError's `str()` names the file
(`[Errno 28] No space left on device: '/var/lib/lanner/queues/jobs'`), so a reply carries the
errno's own message and the queue instead, and the full error goes to the log.
"""
from __future__ import annotations

import os

__all__ = ["describe_os_error"]


def describe_os_error(e: OSError, queue: str | None = None) -> str:
    """`No space left on device (queue 'jobs')`: the errno's strerror (or a JournalError's
    reason, which names no file), and the queue when known; never a path."""
    what = getattr(e, "reason", None) or (os.strerror(e.errno) if e.errno else type(e).__name__)
    return f"{what} (queue '{queue}')" if queue else what
