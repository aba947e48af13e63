"""The routed request in one process: a client of worker 1 whose queue worker 0 owns.

`python -m lanner.perf.hotroute [-n REQUESTS] [-c CONNS] [-i BYTES] [-r DEPTH] [--local]`
builds two real workers of a default-layout server (2 workers serving their own clients, no
dedicated front; server/local.py) in this process, with the real rings and wake eventfds between
them (ipc/mesh.py), and opens CONNS memcache connections on worker 1's own front, on fake
transports (hotloop.NullTransport) and with handoffs off, as a client of several queues or
a connection that has not moved yet would be served.  Each turn gives every connection DEPTH
requests (`set` and `get` alternating on one queue that worker 0 owns, like `mixed`) and then
turns the loops as the two processes would: worker 1 (the requests go into its ring to worker 0),
worker 0 (the ring drained, the batch's journal write, the replies into the ring back), worker 1
(the replies to the connections; the held reads' confirms ride with the next turn's requests).
Every reply is checked.  `--local` runs the same connections on worker 0's own front instead:
the same loop turns, every request served where it was read (the fused path), the figure to
compare with.

Instructions (`--callgrind`, as hotloop's: N/5 and N requests under callgrind, the difference
per extra request) count both processes' work for a request, everything but the kernel's part
of the syscalls.  Each turn starts uvloop's `run_forever` several times (the same with `--local`), which the figure includes: compare runs of this rig with each other.
"""
from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time

from lanner.config import load_config
from lanner.fronts.counters import FRONT_COUNTERS
from lanner.fronts.memcache import MemcacheConn
from lanner.ipc.mesh import Mesh, Peers
from lanner.ipc.shm import CounterBlock
from lanner.perf.hotloop import NullTransport, _Clock, check_replies, compiled_modules, instructions, rig_arguments
from lanner.queues.placement import worker_of
from lanner.server.heaptrim import child_gc
from lanner.server.local import attach_front
from lanner.server.status import ServerStatus
from lanner.server.worker import Worker


def queue_of(worker: int, workers: int = 2) -> str:
    """A queue name that `worker` owns."""
    n = 0
    while worker_of("hot%d" % n, workers) != worker:
        n += 1
    return "hot%d" % n


class RoutedRig:
    """Two workers serving their own clients, in this process; connections on worker `home`."""

    def __init__(self, folder: str, conns: int, home: int = 1, config=None, transport=None) -> None:
        self.config = config or load_config(None, {"queue_path": os.path.join(folder, "q"),
                                                   "status_file": os.path.join(folder, "status")})
        os.makedirs(self.config.server.queue_path, exist_ok=True)
        peers = Peers(2, 0, embedded=True)
        self.mesh = mesh = Mesh(peers)
        status = ServerStatus.create(bytearray(ServerStatus.SIZE), self.config.server.status_file,
                                     "Up", _Clock())
        counters = CounterBlock.create(peers.slots, FRONT_COUNTERS)
        self.socks = []
        self.workers = []
        for i in range(2):
            inbound, outbound = mesh.worker_rings(i)
            sup, end = socket.socketpair()
            self.socks += [sup, end]
            w = Worker(i, 2, self.config, status, inbound, outbound, mesh.worker_wake[i].fd, end,
                       None, nfronts=peers.slots, peers=peers)
            w.boot()
            slot = peers.of_embedded(i)
            req, resp = mesh.front_rings(slot)
            # no handoff channels: connections never move (a client of several queues)
            attach_front(w, (slot, req, resp, mesh.front_wake[slot].fd, {}, counters, time.time(),
                             None), end)
            w.open_loop()
            self.workers.append(w)
        for w in self.workers:          # as `run` starts: every ring flagged sleeping
            w.pump()
            self.spin(w)
        self.home = self.workers[home]
        self.conns = []
        for _ in range(conns):
            c = MemcacheConn(self.home.front)
            c.connection_made((transport or NullTransport)())
            self.conns.append(c)

    @staticmethod
    def spin(w: Worker) -> None:
        """Iterations of `w`'s loop (ready callbacks, then the events ready now) until no batch
        is due: the events' turn ends in the iteration after theirs."""
        loop = w.loop
        while True:
            loop.call_soon(loop.stop)
            loop.run_forever()
            if not w.turn_scheduled:
                return

    def busy(self) -> bool:
        return any(w.turn_scheduled for w in self.workers)

    def close(self) -> None:
        for w in self.workers:
            w.shutdown()
            w.release()
        for s in self.socks:
            s.close()
        for wake in self.mesh.worker_wake:
            wake.close()


def run(requests: int, conns: int, size: int, depth: int, local: bool = False) -> float:
    """CPU µs per request for `requests` requests; raises if a reply is wrong."""
    with tempfile.TemporaryDirectory(prefix="lanner-hotroute-") as folder:
        rig = RoutedRig(folder, conns, home=0 if local else 1)
        queue = queue_of(0).encode()
        try:
            data = os.urandom(size // 2).hex().encode()[:size].ljust(size, b"x")
            set_req = b"set %s 0 0 %d\r\n%s\r\n" % (queue, size, data)
            get_req = b"get %s\r\n" % queue
            want = b"STORED\r\n" + b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (queue, size, data)
            if depth == 1:
                chunks = (set_req, get_req)
            else:
                chunks = ((set_req + get_req) * (depth // 2),)
            turns = max(2, requests // (conns * depth))
            turns += turns % 2
            home, owner = rig.home, rig.workers[0]
            t0 = time.process_time()
            for t in range(turns):
                chunk = chunks[t % len(chunks)]
                for c in rig.conns:
                    c.data_received(chunk)
                rig.spin(home)          # the requests leave (one publish per ring)
                rig.spin(owner)         # the owner runs them and answers
                rig.spin(home)          # the replies reach their connections
            for _ in range(20):         # whatever a turn left (flow control's held commands)
                if not rig.busy():
                    break
                rig.spin(home)
                rig.spin(owner)
            cpu = time.process_time() - t0
            check_replies(rig.conns, want * (turns * depth // 2))
            return cpu / (turns * conns * depth) * 1e6
        finally:
            rig.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lanner.perf.hotroute", description=__doc__.split("\n\n")[0])
    rig_arguments(p, 100_000, 1)
    p.add_argument("--local", action="store_true", help="the connections on the queue's own worker")
    a = p.parse_args(argv)
    if a.depth < 1 or (a.depth > 1 and a.depth % 2):
        p.error("--depth must be 1 or an even number (set, get pairs)")
    child_gc()
    where = "local" if a.local else "routed"
    if a.callgrind:
        same = ["-c", str(a.concurrency), "-i", str(a.item_size), "-r", str(a.depth)] + \
            (["--local"] if a.local else [])
        small = max(a.requests // 5, a.concurrency * a.depth * 2)
        per = (instructions(same, a.requests, "lanner.perf.hotroute") -
               instructions(same, small, "lanner.perf.hotroute")) / (a.requests - small)
        print("hotroute (%s): %d conns, %d B, %d per turn each: %.0f instructions/request "
              "(callgrind); compiled: %s" % (where, a.concurrency, a.item_size, a.depth, per,
                                             ", ".join(compiled_modules()) or "none"))
        return 0
    best = min(run(a.requests, a.concurrency, a.item_size, a.depth, a.local) for _ in range(a.rounds))
    print("hotroute (%s): %d requests, %d conns, %d B, %d per turn each: %.2f CPU µs/request; "
          "compiled: %s" % (where, a.requests, a.concurrency, a.item_size, a.depth, best,
                            ", ".join(compiled_modules()) or "none"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
