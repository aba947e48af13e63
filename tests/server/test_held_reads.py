"""A plain read whose reply crosses a process (server/holding.py): the item survives the death of
the process that holds the client's connection before it wrote the reply.

Each case freezes the process that holds the client's connection (the `holder`: a dedicated
front, or worker 0 serving its own clients) between the owner's remove and its own write to the
socket, deterministically: the owner is stopped while the holder reads the client's request and
publishes it to the ring (the server end's receive queue empties, and a `version` round trip on
the holder ends that turn), then the holder is stopped, the owner resumed until it has published
its reply (the holder's wake eventfd counts it), and the holder is killed.  Before, the items
were removed for good (a REMOVE in the owner's journal) and lost; now they come back to the head
of their queue, in order.
"""
import os
import signal
import threading

import psutil
import pytest

from lanner.perf.stress_restarts import workers
from lanner.perf.thrift_client import KestrelThrift
from lanner.queues.placement import worker_of
from tests.helpers import start_server, wait_for
from tests.server.conftest import Client
from tests.server.test_local import clients_on, queue_of

pytestmark = pytest.mark.integration


def fronts(h) -> list[psutil.Process]:
    return [p for p in psutil.Process(h.proc.pid).children() if p.name().startswith("lanner-f")]


def eventfds(pid: int) -> dict[int, int]:
    """fd -> count of every eventfd process `pid` holds (/proc/PID/fdinfo)."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:[eventfd]":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                for line in f:
                    if line.startswith("eventfd-count:"):
                        out[int(fd)] = int(line.split()[1], 16)
        except OSError:
            continue
    return out


def unread(port: int) -> int:
    """Bytes clients sent on their open connections to `port` that the server has not read
    (Recv-Q of its ESTABLISHED ends, /proc/net/tcp)."""
    total = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":
                total += int(fields[4].split(":")[1], 16)
    return total


def stopped(p: psutil.Process) -> bool:
    return p.status() == psutil.STATUS_STOPPED


def freeze_holder_with_replies(h, holder, owner, port: int, poke: Client, send) -> None:
    """`send()` a request on a connection of `holder` for a queue of `owner`; return with the
    holder stopped after publishing it and the owner's reply published to it, unread."""
    owner.send_signal(signal.SIGSTOP)
    try:
        assert wait_for(lambda: stopped(owner), 10)
        send()
        assert wait_for(lambda: unread(port) == 0, 10)       # the holder read it ...
        assert poke.ask(b"version\r\n").startswith(b"VERSION")   # ... and ended that turn
        holder.send_signal(signal.SIGSTOP)
        assert wait_for(lambda: stopped(holder), 10)
        before = eventfds(holder.pid)
    finally:
        owner.send_signal(signal.SIGCONT)
    # the owner runs the request, writes its journal, publishes the reply and wakes the holder
    assert wait_for(lambda: any(n > before.get(fd, 0) for fd, n in eventfds(holder.pid).items()), 10)


def kill_holder(h, holder, role: str) -> None:
    """kill -9 `holder` and wait for its replacement (which starts only once every worker has
    heard of the death, and so rolled back what it held)."""
    ready = h.log().count(role + " ready")
    holder.send_signal(signal.SIGKILL)
    assert wait_for(lambda: h.log().count(role + " ready") > ready, 30), h.log()


def drain(h, q: bytes, port=None) -> list[bytes]:
    """Every item of `q`, through a new connection."""
    def connected():
        try:
            drain.c = Client(h.connect(port))
            return drain.c.ask(b"version\r\n").startswith(b"VERSION")
        except OSError:
            return False
    assert wait_for(connected, 30), h.log()
    c = drain.c
    got = []
    while True:
        r = c.ask(b"get %s\r\n" % q, b"END\r\n")
        if r == b"END\r\n":
            break
        got.append(r.split(b"\r\n")[1])
    c.close()
    return got


REQUESTS = {
    # name: (bytes the client sends for the queue, items it takes)
    "plain": (lambda q: b"get %s\r\nget %s\r\nget %s\r\n" % (q, q, q), 3),
    "multi-key": (lambda q: b"get %s %s %s\r\n" % (q, q, q), 3),
    "blocking": (lambda q: b"get %s/t=5000\r\n" % q, 1),
}


def fill(h, q: bytes, n: int) -> list[bytes]:
    c = Client(h.connect())
    items = [b"%s-%d" % (q, i) for i in range(n)]
    for it in items:
        assert c.ask(b"set %s 0 0 %d\r\n%s\r\n" % (q, len(it), it)) == b"STORED\r\n"
    c.close()
    return items


@pytest.fixture(scope="module")
def dedicated(tmp_path_factory):
    """One worker behind one dedicated front: every get crosses the ring."""
    h = start_server(tmp_path_factory.mktemp("held-dedicated"), workers=1, fronts=1,
                     worker_fronts=False, thrift=True)
    yield h
    h.stop()


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """Two workers serving their own clients: worker 0's client reads worker 1's queue."""
    h = start_server(tmp_path_factory.mktemp("held-embedded"), workers=2, thrift=True)
    yield h
    h.stop()


def holder_and_owner(h, layout):
    """(holder, owner, owner's index, the holder's name in the log)."""
    if layout == "dedicated":
        [front] = fronts(h)
        return front, workers(h.proc.pid)[0], 0, "front 0"
    w = workers(h.proc.pid)
    return w[0], w[1], 1, "worker 0"


def connection_on(h, layout, n=1, port=None):
    if layout == "dedicated":
        return [Client(h.connect(port)) for _ in range(n)]
    return clients_on(h, 0, n, port)


@pytest.mark.parametrize("kind", sorted(REQUESTS))
@pytest.mark.parametrize("layout", ["dedicated", "embedded"])
def test_a_reply_the_holder_never_wrote_gives_its_items_back(request, layout, kind):
    h = request.getfixturevalue(layout)
    holder, owner, owner_index, role = holder_and_owner(h, layout)
    q = queue_of(owner_index, 2 if layout == "embedded" else 1, prefix="held-%s-" % kind)
    items = fill(h, q, 4)
    make, taken = REQUESTS[kind]
    c, poke = connection_on(h, layout, 2)
    freeze_holder_with_replies(h, holder, owner, h.memcache_port, poke, lambda: c.send(make(q)))
    kill_holder(h, holder, role)
    assert c.is_closed(10) and c.buf == b""            # it died with nothing written
    # before: the first `taken` items were gone (REMOVEd by the owner, written by nobody)
    assert drain(h, q) == items
    assert taken


@pytest.mark.parametrize("layout", ["dedicated", "embedded"])
def test_a_thrift_get_without_auto_abort_gives_its_items_back(request, layout):
    h = request.getfixturevalue(layout)
    holder, owner, owner_index, role = holder_and_owner(h, layout)
    q = queue_of(owner_index, 2 if layout == "embedded" else 1, prefix="held-thrift-")
    items = fill(h, q, 4)
    [poke] = connection_on(h, layout)
    if layout == "dedicated":
        t = KestrelThrift("127.0.0.1", h.thrift_port, timeout=30)
    else:
        for _ in range(400):        # a thrift connection that worker 0 accepted
            t = KestrelThrift("127.0.0.1", h.thrift_port, timeout=30)
            t.peek(q.decode())
            if unread(h.thrift_port) == 0 and _served_by(h, t, holder):
                break
            t.close()
    outcome = []

    def call():
        try:
            outcome.append(t.get(q.decode(), 3))
        except Exception as e:      # the holder dies: the call fails
            outcome.append(e)
    caller = threading.Thread(target=call)
    freeze_holder_with_replies(h, holder, owner, h.thrift_port, poke, caller.start)
    kill_holder(h, holder, role)
    caller.join(30)
    assert outcome and isinstance(outcome[0], Exception), outcome
    assert drain(h, q) == items


def _served_by(h, t: KestrelThrift, holder) -> bool:
    ports = {c.laddr.port for c in psutil.Process(os.getpid()).net_connections(kind="tcp")
             if c.raddr and c.raddr.port == h.thrift_port}
    return any(c.raddr and c.raddr.port in ports for c in holder.net_connections(kind="tcp"))


def test_an_item_a_waiter_receives_comes_back_if_its_holder_dies(embedded):
    """A blocking get routed to worker 1 waits there; the item set later is handed to it (a held
    read), and worker 0, which holds the client, dies before it writes the reply."""
    h = embedded
    holder, owner, _, role = holder_and_owner(h, "embedded")
    q = queue_of(1, 2, prefix="held-waiter-")
    [c] = clients_on(h, 0, 1)
    [setter] = clients_on(h, 1, 1)
    c.send(b"get %s/t=10000\r\n" % q)
    assert wait_for(lambda: _waiters(setter, q) == 1, 10)
    holder.send_signal(signal.SIGSTOP)
    assert wait_for(lambda: stopped(holder), 10)
    before = eventfds(holder.pid)
    assert setter.ask(b"set %s 0 0 4\r\nlate\r\n" % q) == b"STORED\r\n"
    assert wait_for(lambda: any(n > before.get(fd, 0) for fd, n in eventfds(holder.pid).items()), 10)
    kill_holder(h, holder, role)
    assert c.is_closed(10) and c.buf == b""
    assert drain(h, q, None) == [b"late"]
    setter.close()


def _waiters(c: Client, q: bytes) -> int:
    out = c.ask(b"stats\r\n", b"END\r\n")
    for line in out.split(b"\r\n"):
        if line.startswith(b"STAT queue_%s_waiters " % q):
            return int(line.split()[2])
    return 0


def test_held_reads_are_invisible_and_confirmed_once_written(dedicated):
    """Routed plain gets leave no open transaction a client can see, and each is confirmed once
    its reply is written: killed after that, the owner's replay brings back only the item
    nobody read."""
    h = dedicated
    q = queue_of(0, 1, prefix="held-seen-")
    items = fill(h, q, 3)
    path = os.path.join(h.queue_path, q.decode())
    size = os.path.getsize(path)
    c = Client(h.connect())
    c.send(b"get %s\r\nget %s\r\n" % (q, q))
    for it in items[:2]:
        assert c.recv_until(b"END\r\n") == b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (q, len(it), it)
    out = c.ask(b"stats\r\n", b"END\r\n")
    prefix = b"STAT queue_%s_" % q
    st = {line[len(prefix):].split()[0]: line.split()[2] for line in out.split(b"\r\n")
          if line.startswith(prefix)}
    assert (st[b"items"], st[b"open_transactions"], st[b"transactions"],
            st[b"canceled_transactions"]) == (b"1", b"0", b"0", b"0")
    # two REMOVE_TENTATIVEs and their CONFIRM_REMOVEs (5 bytes each) reach the journal: the
    # confirms leave the front with its next publish (before: two 1-byte REMOVEs)
    assert wait_for(lambda: os.path.getsize(path) == size + 20, 10), os.path.getsize(path) - size
    kill_holder(h, workers(h.proc.pid)[0], "worker 0")      # the owner, this time
    assert drain(h, q) == [items[2]]
