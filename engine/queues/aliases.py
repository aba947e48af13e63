"""What an alias keeps (reference §5.7): nothing but its put counters.

An alias stores no items (its destinations do, each in its own worker), so the only state it
has is what `stats` shows for it: the items and bytes written to it since start-up.
"""
from __future__ import annotations


class AliasCounts:
    """put_items and put_bytes per alias, counted by the alias's worker."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}     # alias -> [put_items, put_bytes]

    def count(self, alias: str, items: int, nbytes: int) -> None:
        counts = self._counts.get(alias)
        if counts is None:
            counts = self._counts[alias] = [0, 0]
        counts[0] += items
        counts[1] += nbytes

    def stats(self, alias: str, dests) -> list[tuple[str, str]]:
        items, nbytes = self._counts.get(alias, (0, 0))
        return [("put_items", str(items)), ("put_bytes", str(nbytes)), ("children", ",".join(dests))]
