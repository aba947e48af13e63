"""Column buffers that become Arrow record batches matching a Spark schema exactly.

Spark's Python data sources accept `pyarrow.RecordBatch`es whose schema equals
`to_arrow_schema(spark_schema, timezone="UTC")`; building columns directly is
about 1.5x faster than yielding tuples.  Timestamps are given here as integer
microseconds since the epoch (None for null).
"""
from __future__ import annotations

import pyarrow as pa

BATCH_ROWS = 8192
BATCH_BYTES = 32 << 20            # keeps binary columns far below Arrow's 2 GiB offsets

# microseconds outside this range do not fit a Spark TIMESTAMP; such fields become null
MIN_US = -62135596800 * 1_000_000          # 0001-01-01
MAX_US = 253402300799 * 1_000_000          # 9999-12-31


def ms_to_us(ms: int | None):
    if not ms:
        return None
    us = ms * 1000
    return us if MIN_US <= us <= MAX_US else None


def arrow_schema(spark_schema):
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(spark_schema, timezone="UTC")


class Columns:
    """Append rows column by column; `batch()` hands back a RecordBatch and empties."""

    def __init__(self, spark_schema) -> None:
        self.schema = arrow_schema(spark_schema)
        self.names = [f.name for f in self.schema]
        self.cols: list[list] = [[] for _ in self.names]
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.cols[0])

    def full(self) -> bool:
        return len(self.cols[0]) >= BATCH_ROWS or self.nbytes >= BATCH_BYTES

    def batch(self) -> pa.RecordBatch:
        arrays = []
        for f, col in zip(self.schema, self.cols):
            t = f.type
            if pa.types.is_timestamp(t):
                arrays.append(pa.array(col, pa.int64()).cast(t))
            else:
                arrays.append(pa.array(col, t))
        self.cols = [[] for _ in self.names]
        self.nbytes = 0
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)
