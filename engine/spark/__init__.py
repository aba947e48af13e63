"""Lanner's Spark pipeline: journals, command logs and live queues as Spark data.

    from lanner.spark import register
    register(spark)       # adds the formats lanner-journal, lanner-cmdlog and lanner

Needs the `spark` extra (pyspark 4.3, pyarrow).  The server never imports this
package; importing it does not import pyspark either, only `register` does.
"""
from __future__ import annotations

FORMATS = ("lanner-journal", "lanner-cmdlog", "lanner")


def sources() -> list:
    """The DataSource classes, one per format."""
    # lazy: `import lanner.spark` must not load pyspark; register() runs inside Spark
    from .cmdlog_source import CmdlogSource
    from .journal_source import JournalSource
    from .stream_source import QueueSource
    return [JournalSource, CmdlogSource, QueueSource]


def register(spark) -> None:
    """Register every Lanner format on a SparkSession."""
    for cls in sources():
        spark.dataSource.register(cls)


__all__ = ["register", "sources", "FORMATS"]
