"""The engine modules the Spark package reads through: one place to follow the layout.

Everything here is the server's own code (record codecs, segment framing, workq
replay); the Spark sources never re-implement a format.  Importing this module
does not import pyspark.
"""
from __future__ import annotations

from ..storage.journal import journal as J                 # Kestrel journal codec and Cursor
from ..storage.cmdlog import segment as S                   # workq segment framing, CRC, commands
from ..storage.cmdlog.cmdlog import (LEASED, NEW, PENDING, STATE_NAMES, Replayer, job_uuid,  # noqa: F401
                                     name_str)

__all__ = ["J", "S", "Replayer", "job_uuid", "name_str", "LEASED", "PENDING", "NEW", "STATE_NAMES"]
