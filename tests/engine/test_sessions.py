"""Session: per-connection open reads, FIFO per queue (§1.5, §1.6, §9.3)."""
from __future__ import annotations

from lanner.queues.sessions import Session


def test_open_reads_are_fifo_per_queue():
    s = Session(("front", 7))
    assert s.key == ("front", 7)
    s.add_open("a", 1)
    s.add_open("a", 2)
    s.add_open("b", 1)
    assert (s.open_count("a"), s.open_count("b"), s.open_count("c")) == (2, 1, 0)
    assert s.pop_oldest("a") == 1
    assert s.pop_oldest("a") == 2
    assert s.pop_oldest("a") is None
    assert s.open_count("a") == 0


def test_confirm_n_is_all_or_nothing():
    s = Session(1)
    for xid in (5, 6, 7):
        s.add_open("q", xid)
    assert s.pop_oldest_n("q", 4) is None
    assert s.pop_oldest_n("q", 0) is None
    assert s.pop_oldest_n("q", -1) is None
    assert s.open_count("q") == 3
    assert s.pop_oldest_n("q", 2) == [5, 6]
    assert s.pop_oldest_n("q", 1) == [7]
    assert s.pop_oldest_n("q", 1) is None
    assert s.pop_oldest_n("other", 1) is None


def test_all_open_is_oldest_first_per_queue():
    s = Session(1)
    s.add_open("a", 1)
    s.add_open("b", 9)
    s.add_open("a", 2)
    assert s.all_open() == [("a", 1), ("a", 2), ("b", 9)]
    s.clear()
    assert s.all_open() == [] and s.open_count("a") == 0
