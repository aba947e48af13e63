"""WaitList (FIFO, lazy cancel, wake one/all) and TimerHeap (lazy deadlines)."""
from __future__ import annotations

from lanner.queues.waiters import TimerHeap, Waiter, WaitList


def w(key, deadline=None, **kw) -> Waiter:
    return Waiter(key, "q", deadline, **kw)


def test_wake_one_is_fifo():
    wl = WaitList()
    a, b, c = w("a"), w("b"), w("c")
    for x in (a, b, c):
        wl.add(x)
    assert len(wl) == 3
    assert wl.wake_one() is a and a.woken and not a.queued
    assert wl.wake_one() is b
    assert len(wl) == 1
    assert wl.wake_one() is c
    assert wl.wake_one() is None and len(wl) == 0


def test_cancel_is_lazy_and_skipped():
    wl = WaitList()
    a, b = w("a"), w("b")
    wl.add(a)
    wl.add(b)
    wl.cancel(a)
    assert len(wl) == 1 and a.cancelled
    assert wl.wake_one() is b
    wl.cancel(a)                      # idempotent
    assert len(wl) == 0


def test_woken_waiter_rejoins_at_the_tail():
    wl = WaitList()
    a, b = w("a", 100), w("b", 200)
    wl.add(a)
    wl.add(b)
    got = wl.wake_one()
    assert got is a
    wl.add(a)                         # lost the race: back of the line, same deadline
    assert not a.woken and a.queued and a.deadline_ms == 100
    assert wl.wake_one() is b
    assert wl.wake_one() is a


def test_cancel_after_wake_does_not_change_the_count():
    wl = WaitList()
    a, b = w("a"), w("b")
    wl.add(a)
    wl.add(b)
    wl.wake_one()
    wl.cancel(a)                      # served after the wake-up
    assert len(wl) == 1
    wl.add(a)                         # a cancelled waiter never comes back
    assert len(wl) == 1


def test_add_twice_is_ignored():
    wl = WaitList()
    a = w("a")
    wl.add(a)
    wl.add(a)
    assert len(wl) == 1
    assert wl.wake_one() is a and wl.wake_one() is None


def test_wake_all_evicts_everyone_live():
    wl = WaitList()
    a, b, c = w("a"), w("b"), w("c")
    for x in (a, b, c):
        wl.add(x)
    wl.cancel(b)
    assert wl.wake_all() == [a, c]
    assert a.evicted and c.evicted and not b.evicted
    assert len(wl) == 0 and wl.wake_one() is None


def test_many_cancels_compact_the_list():
    wl = WaitList()
    keep = w("keep")
    wl.add(keep)
    for i in range(1000):
        x = w(i)
        wl.add(x)
        wl.cancel(x)
    assert len(wl) == 1
    assert len(wl._dq) < 100
    assert wl.wake_one() is keep


def test_timer_heap_pops_due_in_deadline_order():
    th = TimerHeap()
    a, b, c = w("a", 30), w("b", 10), w("c", 20)
    wl = WaitList()
    for x in (a, b, c):
        wl.add(x)
        th.push(x.deadline_ms, x)
    assert th.next_deadline() == 10
    assert th.pop_due(9) == []
    assert th.pop_due(20) == [b, c]
    assert th.next_deadline() == 30
    assert th.pop_due(100) == [a]
    assert th.next_deadline() is None


def test_timer_heap_skips_cancelled_and_in_flight_waiters():
    th = TimerHeap()
    wl = WaitList()
    a, b, c = w("a", 10), w("b", 10), w("c", 10)
    for x in (a, b, c):
        wl.add(x)
        th.push(10, x)
    wl.cancel(a)
    wl.wake_one()                      # a was cancelled, so b is woken: in flight
    assert th.next_deadline() == 10    # c is live
    assert th.pop_due(10) == [c]


def test_timer_heap_duplicates_come_out_once():
    th = TimerHeap()
    wl = WaitList()
    a = w("a", 10)
    wl.add(a)
    th.push(10, a)
    th.push(5, a)
    assert th.pop_due(10) == [a]


def test_timer_heap_drops_dead_entries_from_the_top():
    th = TimerHeap()
    wl = WaitList()
    a, b = w("a", 10), w("b", 50)
    for x in (a, b):
        wl.add(x)
        th.push(x.deadline_ms, x)
    wl.cancel(a)
    assert th.next_deadline() == 50
    assert len(th) == 1


def test_timer_heap_holds_arbitrary_items():
    class Job:
        cancelled = False

    th = TimerHeap()
    j1, j2 = Job(), Job()
    th.push(5, j1)
    th.push(5, j2)
    j2.cancelled = True
    th.push(7, "plain string")
    assert th.pop_due(10) == [j1, "plain string"]


def test_timer_heap_compacts_served_waiters():
    th = TimerHeap()
    wl = WaitList()
    live = w("live", 10**9)
    wl.add(live)
    th.push(live.deadline_ms, live)
    for i in range(5000):
        x = w(i, 10**9)
        wl.add(x)
        th.push(x.deadline_ms, x)
        wl.cancel(x)                   # served before its deadline
    assert len(th) < 2100
    assert th.pop_due(10**9) == [live]
