"""The request hot path in one process, without sockets: CPU per request that the neighbours
on a shared box cannot blur.

`python -m lanner.perf.hotloop [-n REQUESTS] [-c CONNS] [-i BYTES] [-r DEPTH] [--rounds N]`
builds one real worker (journal storage in a temporary folder) with its own front
(server/local.py), opens CONNS memcache connections on fake transports, and then, turn after
turn, gives every connection DEPTH requests (`set` and `get` alternating on one queue, like
`mixed`), runs one iteration of the worker's uvloop loop (the turn's journal write, the
replies) and checks every reply.  `-r 1` is a closed-loop client's shape (`mixed -c 1`): one
request per turn, a set in one turn and a get in the next, so the figure carries a whole
turn's fixed cost per request.  Everything a request costs in the server process is in the
figure (parser, connection, routing, queue, journal `os.write`) except the socket syscalls
and epoll.  `--prefill N` puts N items first (as `mixed` puts 512), so the queue is never empty
and its journal may start past default_journal_size; `--lanner-config FILE` gives the queue
the `[default]` settings of a TOML file (a small `max_memory_size` and `max_journal_size` under a
bigger prefill: a backlog read behind, with its files past the journal limit).  It prints CPU
µs per request (process time, the best of the rounds) and which lanner modules are compiled
(setup.py).

Process time still moves by 10-30 % on a box whose other cores are busy (shared caches), so
`--callgrind` counts instructions instead: it runs this benchmark twice under valgrind's
callgrind (N/5 and N requests) and divides the difference by the extra requests, which cancels
the start-up.  The count is the same from run to run to within a fraction of a percent.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

from lanner.config import load_config
from lanner.fronts.counters import FRONT_COUNTERS
from lanner.fronts.memcache import MemcacheConn
from lanner.ipc.mesh import Mesh, Peers
from lanner.ipc.shm import CounterBlock
from lanner.server.heaptrim import child_gc
from lanner.server.local import LocalFront, attach_front
from lanner.server.status import ServerStatus
from lanner.server.worker import Worker

QUEUE = "hot"


class NullTransport:
    """What a connection needs of an asyncio transport; keeps the bytes written.  The queries a
    connection makes per request are C calls, as uvloop's are, not Python frames that would
    count against the server."""

    get_write_buffer_size = staticmethod(int)       # 0
    is_closing = staticmethod(bool)                 # False

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def get_extra_info(self, name, default=None):
        return default

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        raise AssertionError("the server closed a benchmark connection")

    def abort(self) -> None:
        """The worker's shutdown drops its connections."""


class Rig:
    """One worker serving its own clients, in this process."""

    def __init__(self, folder: str, conns: int, config=None, transport=None, config_file=None,
                 front_class=LocalFront) -> None:
        """`config` (tests): instead of the defaults with `folder`'s paths; `transport`: makes
        each connection's transport (NullTransport); `config_file`: a TOML file whose queue
        settings the rig's queue takes (its paths are still `folder`'s); `front_class` (tests):
        the worker's own front, a LocalFront subclass that records calls (attach_front)."""
        self.config = config or load_config(config_file, {"queue_path": os.path.join(folder, "q"),
                                                          "status_file": os.path.join(folder, "status")})
        os.makedirs(self.config.server.queue_path, exist_ok=True)
        peers = Peers(1, 0, embedded=True)
        self.mesh = Mesh(peers)
        status = ServerStatus.create(bytearray(ServerStatus.SIZE), self.config.server.status_file,
                                     "Up", _Clock())
        counters = CounterBlock.create(peers.slots, FRONT_COUNTERS)
        inbound, outbound = self.mesh.worker_rings(0)
        self.sup, worker_end = socket.socketpair()
        self.worker = w = Worker(0, 1, self.config, status, inbound, outbound,
                                 self.mesh.worker_wake[0].fd, worker_end, None,
                                 nfronts=peers.slots, peers=peers)
        w.boot()
        req, resp = self.mesh.front_rings(0)
        attach_front(w, (0, req, resp, self.mesh.front_wake[0].fd, {}, counters, time.time(), None),
                     worker_end, front_class)
        w.open_loop()
        self.conns = []
        for _ in range(conns):
            c = MemcacheConn(w.front)
            c.connection_made((transport or NullTransport)())
            self.conns.append(c)

    def turn(self) -> None:
        """One iteration of the worker's loop: what the requests scheduled (the batch's end)."""
        loop = self.worker.loop
        loop.call_soon(loop.stop)
        loop.run_forever()

    def run_turns(self, turns: int, feed) -> None:
        """`turns` iterations of the worker's loop running on, each starting with `feed()` (what
        the sockets would have delivered) and ending with the batch that feed scheduled, as
        the server's loop turns; then the turns until no batch is due.  (Starting the loop per
        turn, as `turn` does, would count uvloop's signal set-up on every turn.)"""
        loop = self.worker.loop
        worker = self.worker
        left = turns

        def step():
            nonlocal left
            if not left:
                if worker.turn_scheduled:      # commands flow control held back were taken
                    loop.call_soon(step)
                else:
                    loop.stop()
                return
            left -= 1
            feed()
            loop.call_soon(step)       # behind the batch the feed scheduled
        loop.call_soon(step)
        loop.run_forever()

    def close(self) -> None:
        self.worker.shutdown()
        self.worker.release()
        self.sup.close()
        for wake in self.mesh.worker_wake + self.mesh.front_wake:
            wake.close()


class _Clock:
    """ServerStatus only asks for the time of day."""

    @staticmethod
    def now_ms() -> int:
        return int(time.time() * 1000)

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()


def run(requests: int, conns: int, size: int, depth: int, prefill: int = 0, config_file=None) -> float:
    """CPU µs per request for `requests` requests after `prefill` items; raises if a reply is
    wrong."""
    with tempfile.TemporaryDirectory(prefix="lanner-hotloop-") as folder:
        rig = Rig(folder, conns, config_file=config_file)
        try:
            load = Workload(rig, requests, size, depth, prefill)
            t0 = time.process_time()
            rig.run_turns(load.turns, load.feed)
            cpu = time.process_time() - t0
            load.check()
            return cpu / load.requests * 1e6
        finally:
            rig.close()


class Workload:
    """`mixed`'s shape on a rig: `feed` gives every connection `depth` requests (`set` and `get`
    alternating on one queue) for one of `turns` turns; built after `prefill` items and a turn
    that leaves no reply behind, so what runs next is the requests alone (run, opcodes.py)."""

    def __init__(self, rig: Rig, requests: int, size: int, depth: int, prefill: int = 0) -> None:
        self.rig = rig
        data = os.urandom(size // 2).hex().encode()[:size].ljust(size, b"x")
        set_req = b"set %s 0 0 %d\r\n%s\r\n" % (QUEUE.encode(), size, data)
        get_req = b"get %s\r\n" % QUEUE.encode()
        self.want = (b"STORED\r\n" + b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (QUEUE.encode(), size, data))
        self.depth = depth
        turns = max(1, requests // (len(rig.conns) * depth))
        conns = rig.conns
        if depth == 1:
            # one request per turn: a set, then in the next turn the get that finds it
            turns += turns % 2
            chunks = (set_req, get_req)
            sent = 0

            def feed():
                nonlocal sent
                chunk = chunks[sent & 1]
                sent += 1
                for c in conns:
                    c.data_received(chunk)
        else:
            # depth requests per connection per turn: sets and gets alternate, every get
            # finds the item the set before it stored
            chunk = (set_req + get_req) * (depth // 2)

            def feed():
                for c in conns:
                    c.data_received(chunk)
        self.feed = feed
        self.turns = turns
        self.requests = turns * len(conns) * depth
        for i in range(0, prefill, 100):
            conns[0].data_received(set_req * min(100, prefill - i))
            rig.turn()
        rig.turn()
        for c in conns:
            c.transport.written.clear()

    def check(self) -> None:
        """Every reply of the turns run since, byte for byte."""
        check_replies(self.rig.conns, self.want * (self.turns * self.depth // 2))


def check_replies(conns, expect: bytes) -> None:
    """Every connection was answered `expect`, byte for byte: a rig that got faster by
    answering wrongly measured nothing."""
    for c in conns:
        out = b"".join(c.transport.written)
        if out != expect:
            raise AssertionError("wrong replies: %r..." % out[:200])


def compiled_modules() -> list[str]:
    """The lanner modules this interpreter loaded from a compiled extension."""
    # imported here: setup.py's list is the one place that names them, and this module
    # must not need setuptools to run
    from lanner.compiled import HOT_MODULES
    out = []
    for name in HOT_MODULES:
        mod = importlib.import_module(name)
        if not mod.__file__.endswith(".py"):
            out.append(name)
    return out


def instructions(args: list[str], requests: int, module: str = "lanner.perf.hotloop") -> int:
    """Instructions this benchmark (or `module`'s, hotroute.py) executes for `requests`
    requests, start-up included."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-m",
           module, "-n", str(requests), "--rounds", "1", *args]
    env = dict(os.environ, PYTHONHASHSEED="0")      # the same dict layouts in both runs
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    m = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if m is None:
        raise RuntimeError("callgrind printed no count: " + done.stderr[-500:])
    return int(m.group(1))


def rig_arguments(p, requests: int, depth: int) -> None:
    """The options of a rig run here or in hotroute.py (one spelling for both)."""
    p.add_argument("-n", "--requests", type=int, default=requests)
    p.add_argument("-c", "--concurrency", type=int, default=10)
    p.add_argument("-i", "--item-size", type=int, default=1024)
    p.add_argument("-r", "--depth", type=int, default=depth,
                   help="requests per connection per turn: 1 (a set or a get per turn) or even")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--callgrind", action="store_true",
                   help="count instructions per request under valgrind instead of timing")
    p.add_argument("--opcodes", action="store_true",
                   help="count bytecodes and Python calls per request, per function (opcodes.py)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lanner.perf.hotloop", description=__doc__.split("\n\n")[0])
    rig_arguments(p, 200_000, 2)
    p.add_argument("--prefill", type=int, default=0, help="items put first (all alike: gets find them)")
    p.add_argument("--lanner-config", metavar="FILE",
                   help="TOML config whose [default] queue settings the queue takes (e.g. a small "
                        "max_memory_size under a bigger --prefill: a backlog read behind)")
    a = p.parse_args(argv)
    if a.depth < 1 or (a.depth > 1 and a.depth % 2):
        p.error("--depth must be 1 or an even number (set, get pairs)")
    child_gc()          # the collector as a server child has it (not in run(): tests call that)
    if a.opcodes:
        from lanner.perf.opcodes import profile      # (its own module: the tracer and the table)
        print(profile(a.requests, a.concurrency, a.item_size, a.depth, a.prefill, a.lanner_config).report())
        return 0
    if a.callgrind:
        same = ["-c", str(a.concurrency), "-i", str(a.item_size), "-r", str(a.depth), "--prefill", str(a.prefill)]
        if a.lanner_config:
            same += ["--lanner-config", os.path.abspath(a.lanner_config)]
        small = max(a.requests // 5, a.concurrency * a.depth)
        per = (instructions(same, a.requests) - instructions(same, small)) / (a.requests - small)
        print("hotloop: %d conns, %d B, %d per turn each: %.0f instructions/request (callgrind); "
              "compiled: %s" % (a.concurrency, a.item_size, a.depth, per,
                                ", ".join(compiled_modules()) or "none"))
        return 0
    best = min(run(a.requests, a.concurrency, a.item_size, a.depth, a.prefill, a.lanner_config)
               for _ in range(a.rounds))
    comp = compiled_modules()
    print("hotloop: %d requests, %d conns, %d B, %d per turn each: %.2f CPU µs/request; compiled: %s"
          % (a.requests, a.concurrency, a.item_size, a.depth, best, ", ".join(comp) or "none"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
