"""What the two batch sources (`lanner-journal`, `lanner-cmdlog`) share: each reads a spool as
either live items (the server's replay) or raw records, chosen by the `mode` option, and differs
from the other only in its name, its two schemas and its reader."""
from __future__ import annotations

from pyspark.sql.datasource import DataSource

from ._options import plain


def mode_option(options, source: str) -> str:
    """"items" (the default) or "records"; anything else is refused naming the source."""
    mode = (options.get("mode") or "items").lower()
    if mode not in ("items", "records"):
        raise ValueError(f"{source}: option mode must be 'items' or 'records', got {mode!r}")
    return mode


class BatchSource(DataSource):
    """A subclass declares NAME, SCHEMAS ({"items": ..., "records": ...}) and READER, a
    DataSourceReader class taken as READER(plain options, schema)."""
    NAME: str
    SCHEMAS: dict
    READER: type

    @classmethod
    def name(cls) -> str:
        return cls.NAME

    def schema(self):
        return self.SCHEMAS[mode_option(self.options, self.NAME)]

    def reader(self, schema):
        return self.READER(plain(self.options), schema)
