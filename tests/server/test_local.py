"""Workers that serve their own clients (local.py): inline requests, routed requests, faults."""
import signal

import psutil
import pytest

from lanner.perf.stress_restarts import workers
from lanner.queues.placement import worker_of
from tests.helpers import start_server, wait_for
from tests.server.conftest import Client

pytestmark = pytest.mark.integration


def worker_procs(h) -> list[psutil.Process]:
    """The worker processes, in worker index order (lanner-w0, lanner-w1, ...)."""
    return workers(h.proc.pid)


def replaced(h, old: psutil.Process) -> bool:
    """Whether a new process took `old`'s place: two workers and `old` not among them, read
    in one listing (two listings race the supervisor's reaping of `old`: the first still sees
    its zombie, the second no longer does, and the replacement may not be forked yet)."""
    procs = worker_procs(h)
    return len(procs) == 2 and old.pid not in [p.pid for p in procs]


def serving_workers(h, clients: list[Client], timeout: float = 30.0) -> list[int]:
    """Index of the worker whose socket is the server end of each client.  While a connection
    moves, both workers hold its socket: the adopter serves it (and counts the handoff) before
    the sender has its answer and closes its copy.  So this waits, with a deadline, until one
    worker alone holds each; one listing per worker per look (a listing reads the whole TCP
    table)."""
    ports = [c.sock.getsockname()[1] for c in clients]
    held: dict[int, set[int]] = {}

    def settled() -> bool:
        held.clear()
        for i, p in enumerate(worker_procs(h)):
            for conn in p.net_connections(kind="tcp"):
                if conn.raddr:
                    held.setdefault(conn.raddr.port, set()).add(i)
        return all(len(held.get(port, ())) == 1 for port in ports)
    if not wait_for(settled, timeout):
        bad = {port: sorted(held.get(port, ())) for port in ports if len(held.get(port, ())) != 1}
        raise AssertionError(f"connections not held by exactly one worker (client port: workers): {bad}")
    return [min(held[port]) for port in ports]


def serving_worker(h, c: Client) -> int:
    """Index of the worker whose socket is the server end of client `c` (serving_workers)."""
    return serving_workers(h, [c])[0]


def clients_on(h, worker: int, n: int, port=None, probe=(b"version\r\n", b"\r\n")) -> list[Client]:
    """`n` connections that worker `worker` accepted (SO_REUSEPORT picks; others are closed)."""
    got, spare = [], []
    for _ in range(400):
        c = Client(h.connect(port))
        c.ask(*probe)                 # accepted and served: the socket is in the worker now
        (got if serving_worker(h, c) == worker else spare).append(c)
        if len(got) == n:
            break
    for c in spare:
        c.close()
    assert len(got) == n, "SO_REUSEPORT never picked that worker"
    return got


def queue_of(worker: int, nworkers: int = 2, prefix: str = "lq") -> bytes:
    i = 0
    while worker_of(f"{prefix}{i}", nworkers) != worker:
        i += 1
    return f"{prefix}{i}".encode()


def stat(c: Client, name: bytes) -> int:
    out = c.ask(b"stats\r\n", b"END\r\n")
    for line in out.split(b"\r\n"):
        if line.startswith(b"STAT " + name + b" "):
            return int(line.split()[2])
    raise AssertionError(f"no stat {name!r}")


@pytest.fixture
def h(tmp_path):
    """A running `lanner serve` with two workers (the ServerHandle these tests call h), stopped
    after the test whatever it did."""
    server = start_server(tmp_path, workers=2)
    yield server
    server.stop()


def test_local_and_routed_requests(h):
    """A client of worker 0 is served inline for worker 0's queues and over the rings for worker
    1's; routed_requests counts only the latter."""
    [c] = clients_on(h, 0, 1)
    mine, theirs = queue_of(0), queue_of(1)
    before = stat(c, b"routed_requests")
    assert c.ask(b"set %s 0 0 1\r\na\r\n" % mine) == b"STORED\r\n"
    assert c.ask(b"get %s\r\n" % mine, b"END\r\n") == b"VALUE %s 0 1\r\na\r\nEND\r\n" % mine
    after_local = stat(c, b"routed_requests")
    assert c.ask(b"set %s 0 0 1\r\nb\r\n" % theirs) == b"STORED\r\n"
    after_routed = stat(c, b"routed_requests")
    # stats itself is a fan-out: one routed part per other worker, each time
    assert after_local - before == 1
    assert after_routed - after_local == 2


def test_kill_worker_returns_open_reads_of_its_clients(h):
    """kill -9 of a worker is also the death of the clients it served: the open reads they held
    on another worker's queue go back to that queue."""
    q = queue_of(1)
    setter = Client(h.connect())
    for i in range(3):
        assert setter.ask(b"set %s 0 0 1\r\n%d\r\n" % (q, i)) == b"STORED\r\n"
    [victim_client] = clients_on(h, 0, 1)
    assert victim_client.ask(b"get %s/open\r\n" % q, b"END\r\n") == b"VALUE %s/open 0 1\r\n0\r\nEND\r\n" % q
    victim = worker_procs(h)[0]
    victim.send_signal(signal.SIGKILL)
    assert victim_client.is_closed()
    [survivor] = clients_on(h, 1, 1)
    got = []

    def all_back() -> bool:
        # the read goes back when worker 1 hears of the death (peer_down), which under load
        # can come after the survivor's first gets: an empty get means "not yet", not "lost"
        r = survivor.ask(b"get %s\r\n" % q, b"END\r\n")
        if r != b"END\r\n":
            got.append(r.split(b"\r\n")[1])
        return len(got) >= 3
    assert wait_for(all_back), got
    assert sorted(got) == [b"0", b"1", b"2"]


# -- connection handoff ------------------------------------------------------------------------

def test_single_queue_connections_all_end_local(h):
    """200 connections, each using one queue: every one ends on the worker that owns its queue;
    `handoffs` counts exactly those that started elsewhere, each after two routed requests."""
    watcher = Client(h.connect())
    conns = [Client(h.connect()) for _ in range(200)]
    for c in conns:
        c.ask(b"version\r\n")
    queues = [b"one%d" % (i % 16) for i in range(len(conns))]
    started = serving_workers(h, conns)
    movers = sum(1 for c, q, w in zip(conns, queues, started) if worker_of(q.decode(), 2) != w)
    assert 0 < movers < len(conns)
    h0, r0 = stat(watcher, b"handoffs"), stat(watcher, b"routed_requests")
    for round_ in range(3):
        for c, q in zip(conns, queues):
            c.send(b"set %s 0 0 2\r\nv%d\r\n" % (q, round_))
        for c in conns:
            assert c.recv_until(b"\r\n") == b"STORED\r\n"
    for c, q in zip(conns, queues):
        assert c.ask(b"get %s\r\n" % q, b"END\r\n").startswith(b"VALUE %s 0 2\r\nv" % q)
    assert stat(watcher, b"handoffs") - h0 == movers
    # + one routed part for each of the two stats commands since r0 was read
    assert stat(watcher, b"routed_requests") - r0 == 2 * movers + 2
    assert serving_workers(h, conns) == [worker_of(q.decode(), 2) for q in queues]


def test_pipelined_bytes_during_a_handoff_keep_their_order(h):
    """An unparsed half command travels with the connection, bytes sent while it moves are read
    by the adopter, and every reply comes back once, in order."""
    watcher = Client(h.connect())
    [c] = clients_on(h, 0, 1)
    q = queue_of(1)
    assert c.ask(b"set %s 0 0 1\r\na\r\n" % q) == b"STORED\r\n"
    before = stat(watcher, b"handoffs")
    c.send(b"set %s 0 0 1\r\nb\r\nget %s" % (q, q))        # the get is not finished yet
    assert c.recv_until(b"\r\n") == b"STORED\r\n"
    assert wait_for(lambda: stat(watcher, b"handoffs") == before + 1)
    pipeline = b"\r\n" + b"".join(b"set %s 0 0 3\r\n%03d\r\nget %s\r\n" % (q, i, q) for i in range(100))
    for i in range(0, len(pipeline), 37):                  # in pieces, as they come
        c.send(pipeline[i:i + 37])
    assert c.recv_until(b"END\r\n") == b"VALUE %s 0 1\r\na\r\nEND\r\n" % q
    expect = [b"b"] + [b"%03d" % i for i in range(99)]
    for i in range(100):
        assert c.recv_until(b"\r\n") == b"STORED\r\n"
        assert c.recv_until(b"END\r\n") == b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (q, len(expect[i]), expect[i])
    assert serving_worker(h, c) == 1


def test_handoff_moves_open_reads(h):
    """A connection moves with an open read: the adopter can close it, and the open read it
    holds at disconnect goes back to the queue, exactly once."""
    watcher = Client(h.connect())
    q = queue_of(1)
    for i in range(4):
        assert watcher.ask(b"set %s 0 0 1\r\n%d\r\n" % (q, i)) == b"STORED\r\n"
    [c] = clients_on(h, 0, 1)
    before = stat(watcher, b"handoffs")
    assert c.ask(b"get %s/open\r\n" % q, b"END\r\n").endswith(b"\r\n0\r\nEND\r\n")
    assert c.ask(b"get %s/close/open\r\n" % q, b"END\r\n").endswith(b"\r\n1\r\nEND\r\n")
    assert wait_for(lambda: stat(watcher, b"handoffs") == before + 1)
    assert serving_worker(h, c) == 1
    # item 1 is open on the moved connection: closing it confirms it, the next one opens
    assert c.ask(b"get %s/close/open\r\n" % q, b"END\r\n").endswith(b"\r\n2\r\nEND\r\n")
    c.close()                                               # item 2 goes back
    got = []
    assert wait_for(lambda: watcher.ask(b"stats\r\n", b"END\r\n").count(
        b"STAT queue_%s_open_transactions 0\r\n" % q) == 1)
    while (r := watcher.ask(b"get %s\r\n" % q, b"END\r\n")) != b"END\r\n":
        got.append(r.split(b"\r\n")[1])
    assert got == [b"2", b"3"]


def test_blocking_get_is_not_moved_while_it_waits(h):
    watcher = Client(h.connect())
    q = queue_of(1)
    [c] = clients_on(h, 0, 1)
    before = stat(watcher, b"handoffs")
    assert c.ask(b"set %s 0 0 1\r\na\r\n" % q) == b"STORED\r\n"
    assert c.ask(b"get %s\r\n" % q, b"END\r\n").endswith(b"\r\na\r\nEND\r\n")
    # the handoff happens once that reply is out; then a blocking get waits on the adopter
    assert wait_for(lambda: stat(watcher, b"handoffs") == before + 1)
    [d] = clients_on(h, 0, 1)
    assert d.ask(b"get %s/open\r\n" % q, b"END\r\n") == b"END\r\n"
    d.send(b"get %s/t=3000/open\r\n" % q)             # routed #2, blocks: in flight
    assert wait_for(lambda: b"STAT queue_%s_waiters 1\r\n" % q in watcher.ask(b"stats\r\n", b"END\r\n"))
    assert stat(watcher, b"handoffs") == before + 1            # d does not move while it waits
    assert watcher.ask(b"set %s 0 0 1\r\nc\r\n" % q) == b"STORED\r\n"
    assert d.recv_until(b"END\r\n").endswith(b"\r\nc\r\nEND\r\n")
    assert wait_for(lambda: stat(watcher, b"handoffs") == before + 2), h.log()   # with its open read
    assert d.ask(b"get %s/close\r\n" % q, b"END\r\n") == b"END\r\n"
    assert serving_worker(h, d) == 1


@pytest.mark.parametrize("victim", ["receiver", "sender"])
def test_kill_either_side_mid_handoff(h, victim):
    """The adopter is stopped while a connection is being handed to it, then one side is killed:
    the client gets its reply or an error line, never a wrong reply; only the death of the
    process that holds the connection closes it in silence."""
    q = queue_of(1)
    [c] = clients_on(h, 0, 1)
    procs = worker_procs(h)
    procs[1].send_signal(signal.SIGSTOP)
    try:
        # two fire-and-forget sets make the connection a candidate with nothing in flight
        c.send(b"set %s 0 0 1 noreply\r\nx\r\nset %s 0 0 1 noreply\r\ny\r\n" % (q, q))
        c.send(b"get %s\r\n" % q)
        (procs[1] if victim == "receiver" else procs[0]).send_signal(signal.SIGKILL)
    finally:
        if victim == "sender":
            procs[1].send_signal(signal.SIGCONT)
    c.sock.settimeout(30)
    got = b""
    while True:
        try:
            chunk = c.sock.recv(4096)
        except ConnectionResetError:
            break
        if not chunk:
            break
        got += chunk
        if got.endswith(b"END\r\n"):
            break
    answered = b"VALUE %s 0 1\r\nx\r\nEND\r\n" % q
    if victim == "receiver":
        # worker 0 lives on: the get it routed or held for the adopter fails with an error line
        # (before, a handoff under way ended in a silent close), unless worker 0 read it only
        # once worker 1's replacement was up
        assert got.startswith(b"SERVER_ERROR worker 1 ") or got in (b"END\r\n", answered), got
    else:
        # the connection died with worker 0, or worker 1 adopted it first and answered
        assert got in (b"", answered), got


def server_recv_queue(h, c: Client) -> int:
    """Bytes `c` sent that the server has not read yet (the Recv-Q of the server's end, from
    /proc/net/tcp: whichever process holds that socket, or none while it travels)."""
    ports = "%04X" % h.memcache_port, "%04X" % c.sock.getsockname()[1]
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if (fields[1].split(":")[1], fields[2].split(":")[1]) == ports:
                return int(fields[4].split(":")[1], 16)
    raise AssertionError("no server end for the connection")


def kill_adopter_mid_handoff(h, c: Client, poke: Client) -> None:
    """Worker 0 hands `c` to worker 1, stopped, and stops reading it; the client's next command
    waits unread; then worker 1 is killed.  `poke` (also worker 0's) makes worker 0 turn."""
    q, empty = queue_of(1), queue_of(0, prefix="empty")
    procs = worker_procs(h)
    procs[1].send_signal(signal.SIGSTOP)
    try:
        # two fire-and-forget sets make the connection a candidate with nothing owed; it is
        # handed off at the end of worker 0's next turn, which `poke` makes
        c.send(b"set %s 0 0 1 noreply\r\nx\r\nset %s 0 0 1 noreply\r\ny\r\n" % (q, q))
        assert c.ask(b"version\r\n").startswith(b"VERSION ")
        assert poke.ask(b"get %s\r\n" % empty, b"END\r\n") == b"END\r\n"
        get = b"get %s\r\n" % q
        c.send(get)
        # worker 0 turns again and leaves the get unread: the handoff is under way
        assert poke.ask(b"get %s\r\n" % empty, b"END\r\n") == b"END\r\n"
        assert server_recv_queue(h, c) == len(get)
    finally:
        procs[1].send_signal(signal.SIGKILL)


def test_a_client_whose_adopter_dies_mid_handoff_gets_an_error_line(h):
    """When worker 1's death fails the handoff of a connection, worker 0 answers the command
    that waited unread with SERVER_ERROR before it closes the connection.  Before, the client's
    command was met by a silent close."""
    c, poke = clients_on(h, 0, 2)
    kill_adopter_mid_handoff(h, c, poke)
    assert c.recv_until(b"\r\n", timeout=20) == b"SERVER_ERROR worker 1 restarted\r\n"
    assert c.is_closed()
    # the server goes on: worker 1's replacement serves the queue
    assert wait_for(lambda: h.log().count("worker 1 ready") >= 2, timeout=20), h.log()
    assert wait_for(lambda: stored_fresh(h, queue_of(1)))


def test_a_failed_handoff_closes_before_the_adopters_replacement_starts(tmp_path):
    """The socket's copy in the dead adopter's handoff channel no longer keeps the connection
    open until the replacement starts (which the stopped admin process holds back here: every
    front must acknowledge the death first).  Before, the client waited out the restart."""
    h = start_server(tmp_path, workers=2, admin=True)
    admin = [p for p in psutil.Process(h.proc.pid).children() if p.name() == "lanner-admin"]
    try:
        c, poke = clients_on(h, 0, 2)
        admin[0].send_signal(signal.SIGSTOP)
        try:
            kill_adopter_mid_handoff(h, c, poke)
            assert c.recv_until(b"\r\n", timeout=20) == b"SERVER_ERROR worker 1 restarted\r\n"
            assert c.is_closed(timeout=10)
            assert len(worker_procs(h)) == 1          # no replacement yet: it waits for the admin
        finally:
            admin[0].send_signal(signal.SIGCONT)
        assert wait_for(lambda: h.log().count("worker 1 ready") >= 2, timeout=20), h.log()
        assert wait_for(lambda: stored_fresh(h, queue_of(1)))
    finally:
        assert h.stop() == 0


def stored_fresh(h, q: bytes) -> bool:
    """Whether a new connection's set on `q` is stored (SERVER_ERROR while a worker that went
    down is not yet back for the worker that took the connection)."""
    d = Client(h.connect())
    try:
        r = d.ask(b"set %s 0 0 1\r\nz\r\n" % q)
        assert r in (b"STORED\r\n", b"SERVER_ERROR worker 1 is restarting\r\n"), r
        return r == b"STORED\r\n"
    finally:
        d.close()


def test_text_connection_moves_with_its_open_read(h):
    """A text-protocol client (every get opens a read that the next get confirms) moves to the
    worker of its queue with its open read."""
    watcher = Client(h.connect())
    q = queue_of(1)
    [c] = clients_on(h, 0, 1, port=h.text_port, probe=(b"version\n", b"\n"))
    before = stat(watcher, b"handoffs")
    assert c.ask(b"put %s:\na\nb\nc\n\n" % q, b"\n") == b"+3\n"
    assert c.ask(b"get %s\n" % q, b"\n") == b":a\n"
    assert wait_for(lambda: stat(watcher, b"handoffs") == before + 1)
    assert serving_worker(h, c) == 1
    assert c.ask(b"get %s\n" % q, b"\n") == b":b\n"       # confirms a, opens b: on the adopter
    c.close()                                              # b goes back ...
    # ... once the adopter has seen the close: a new client racing it would be served c
    assert wait_for(lambda: stat(watcher, b"queue_%s_open_transactions" % q) == 0)
    t = Client(h.connect(h.text_port))
    assert t.ask(b"get %s 5000\n" % q, b"\n") == b":b\n"


def test_connection_moves_after_a_stats(h):
    """`stats` touches every worker; once the client uses one queue it still moves."""
    watcher = Client(h.connect())
    q = queue_of(1)
    [c] = clients_on(h, 0, 1)
    assert stat(c, b"handoffs") >= 0
    before = stat(watcher, b"handoffs")
    for i in range(3):
        assert c.ask(b"set %s 0 0 1\r\n%d\r\n" % (q, i)) == b"STORED\r\n"
    assert wait_for(lambda: stat(watcher, b"handoffs") == before + 1)
    assert serving_worker(h, c) == 1


def test_a_set_behind_a_blocking_get_answers_after_it(h):
    """The fused local path (fronts/inline.py) never overtakes: a set pipelined behind a
    blocking get on another queue of the same worker runs, and replies, only after that get."""
    [c] = clients_on(h, 0, 1)
    watcher = Client(h.connect())
    other, mine = queue_of(0, prefix="lw"), queue_of(0)
    c.send(b"get %s/t=10000\r\nset %s 0 0 1\r\nx\r\nget %s\r\n" % (other, mine, mine))
    assert wait_for(lambda: stat(watcher, b"queue_%s_waiters" % other) == 1)
    assert watcher.ask(b"get %s/peek\r\n" % mine) == b"END\r\n"     # the set has not run
    assert watcher.ask(b"set %s 0 0 1\r\ny\r\n" % other) == b"STORED\r\n"
    want = (b"VALUE %s/t=10000 0 1\r\ny\r\nEND\r\nSTORED\r\nVALUE %s 0 1\r\nx\r\nEND\r\n"
            % (other, mine))
    assert c.recv_n(len(want)) == want


def test_pipelined_local_and_routed_requests_answer_in_order(h):
    """Sets and gets on the worker's own queue (fused path) interleaved with requests it
    routes to the other worker and replies it makes at once: every reply in command order."""
    [c] = clients_on(h, 0, 1)
    mine, theirs = queue_of(0), queue_of(1)
    cmds, want = [], []
    for i in range(60):
        item = b"%d" % i
        q = (mine, theirs)[i % 3 == 2]
        cmds.append(b"set %s 0 0 %d\r\n%s\r\nget %s\r\n" % (q, len(item), item, q))
        want.append(b"STORED\r\nVALUE %s 0 %d\r\n%s\r\nEND\r\n" % (q, len(item), item))
        if i % 7 == 0:
            cmds.append(b"get %s\r\nversion\r\n" % mine)
            want.append(b"END\r\nVERSION ")
    c.send(b"".join(cmds))
    for w in want:
        if w.endswith(b"VERSION "):
            assert c.recv_n(len(w)) == w
            c.recv_until(b"\r\n")                  # the version number
        else:
            assert c.recv_n(len(w)) == w


def on_worker(h, worker: int, port: int, wait: float = 0.5) -> Client:
    """A connection that `worker` accepted and answers, while the other worker may be stopped
    (a connection it would have accepted gets no answer and is dropped)."""
    for _ in range(200):
        c = Client(h.connect(port))
        c.send(b"version\r\n")
        try:
            if c.recv_until(b"\r\n", timeout=wait).startswith(b"VERSION "):
                if serving_worker(h, c) == worker:
                    return c
        except OSError:
            pass
        c.close()
    raise AssertionError(f"worker {worker} never took a connection")


def holds(proc: psutil.Process, c: Client) -> bool:
    port = c.sock.getsockname()[1]
    return any(k.raddr and k.raddr.port == port for k in proc.net_connections(kind="tcp"))


def pick(h, keeper: Client, worker: int, open_now: int) -> Client:
    """A connection `worker` accepted, opened while exactly `open_now` others are counted."""
    for _ in range(400):
        assert wait_for(lambda: stat(keeper, b"curr_connections") == open_now)
        c = Client(h.connect())
        c.ask(b"version\r\n")
        if serving_worker(h, c) == worker:
            return c
        c.close()
    raise AssertionError("SO_REUSEPORT never picked that worker")


def stopped_mid_handoff(h, procs, keeper: Client) -> tuple[Client, Client] | None:
    """A connection of worker 0 that worker 1 has adopted while worker 0, stopped, has not let
    go of it yet (worker 0 is left stopped), and the connection that made worker 0 turn; None
    if worker 0 was stopped before it handed off."""
    q, empty = queue_of(1), queue_of(0, prefix="empty")
    c = pick(h, keeper, 0, 1)
    poke = pick(h, keeper, 0, 2)
    procs[1].send_signal(signal.SIGSTOP)
    try:
        # two fire-and-forget sets make the connection a candidate with nothing owed ...
        c.send(b"set %s 0 0 1 noreply\r\nx\r\nset %s 0 0 1 noreply\r\ny\r\n" % (q, q))
        assert c.ask(b"version\r\n").startswith(b"VERSION ")
        # ... handed off at the end of worker 0's next turn, just after `poke` has its END
        assert poke.ask(b"get %s\r\n" % empty, b"END\r\n") == b"END\r\n"
        procs[0].send_signal(signal.SIGSTOP)
    finally:
        procs[1].send_signal(signal.SIGCONT)
    if wait_for(lambda: holds(procs[1], c), 3):
        return c, poke
    procs[0].send_signal(signal.SIGCONT)        # stopped too early: let it hand off, start again
    assert poke.ask(b"get %s\r\n" % empty, b"END\r\n") == b"END\r\n"
    assert wait_for(lambda: holds(procs[1], c) and not holds(procs[0], c))
    c.close()
    poke.close()
    return None


def test_a_connection_counts_once_while_it_moves(tmp_path):
    """curr_connections never counts a moving connection twice (nor misses it): with the
    sender stopped after the adopter took the socket, a new connection's check against
    connection_limit_refuse_writes sees the three other connections, not four."""
    h = start_server(tmp_path, workers=2, config="[server]\nconnection_limit_refuse_writes = 4\n")
    procs = worker_procs(h)
    try:
        keeper = Client(h.connect())
        for _ in range(5):
            moved = stopped_mid_handoff(h, procs, keeper)
            if moved is not None:
                break
        else:
            raise AssertionError("worker 0 never handed the connection off before it stopped")
        c, poke = moved
        try:
            d = on_worker(h, 1, h.memcache_port)
            # main: the adopter counted it and the stopped sender still does: 5 > 4, refused
            assert d.ask(b"set %s 0 0 1\r\nz\r\n" % queue_of(1, prefix="other")) == b"STORED\r\n"
        finally:
            procs[0].send_signal(signal.SIGCONT)
        q = queue_of(1)
        assert c.ask(b"get %s\r\n" % q, b"END\r\n") == b"VALUE %s 0 1\r\nx\r\nEND\r\n" % q
        assert serving_worker(h, c) == 1
        assert wait_for(lambda: stat(d, b"curr_connections") == 4), stat(d, b"curr_connections")
        c.close()
        assert wait_for(lambda: stat(d, b"curr_connections") == 3), stat(d, b"curr_connections")
    finally:
        h.stop()
