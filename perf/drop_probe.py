"""drop_probe: what the c=100 -> c=1000 drop of `mixed` (1 KiB, closed loop) is made of.

`python -m lanner.perf.drop_probe ROUNDS DURATION TAG` starts one `lanner serve` (default layout,
this interpreter's lanner, free ports: servers.start_lanner) and runs c=100 then c=1000 ROUNDS
times, as `compare mixed -i 1024 -c 100,1000` does on its Lanner side (a flush, 512 items put
first, then DURATION seconds at gets:sets 1:1).  Per level it prints one JSON line: the rate, the
loadgen's 250-ms progress (`rates_250ms`: is the start slower?), the handoffs and routed requests
in the level (`stats`), and per server process its CPU (user and system), CPU per request,
voluntary and involuntary context switches, TCP sockets held at mid-run and the cores its threads
were seen running on; also how often the queue's worker and the load generator were seen
running on the same core (`w0_lg_running`).  perf/README.md, stop 22.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

import psutil

from lanner.perf import loadgen
from lanner.perf.client import MemcacheClient
from lanner.perf.loadgen import Load
from lanner.perf.servers import start_lanner

QUEUE = "db_bench"
PREFILL = 512
SAMPLE_S = 0.02


def _threads(p: psutil.Process) -> list[psutil.Process]:
    """A process's threads as psutil processes (Linux: a thread id is a /proc entry); none once
    it has exited (the load generator ends before the sampler stops)."""
    out = []
    try:
        threads = p.threads()
    except psutil.Error:
        return out
    for t in threads:
        try:
            out.append(psutil.Process(t.id))
        except psutil.Error:
            pass
    return out


def _counters(p: psutil.Process) -> tuple[float, float, int, int]:
    """user and system CPU seconds, voluntary and involuntary context switches of every thread."""
    t = p.cpu_times()       # (the server's processes outlive the level)
    vol = invol = 0
    for th in _threads(p):
        try:
            cs = th.num_ctx_switches()
        except psutil.Error:
            continue
        vol, invol = vol + cs.voluntary, invol + cs.involuntary
    return t.user, t.system, vol, invol


def _running_cores(p: psutil.Process) -> list[int]:
    """The cores `p`'s threads are running on right now (runnable ones only)."""
    cores = []
    for th in _threads(p):
        try:
            if th.status() == psutil.STATUS_RUNNING:
                cores.append(th.cpu_num())
        except psutil.Error:
            pass
    return cores


class Sampler(threading.Thread):
    """Every SAMPLE_S while a level runs: where each process's threads run, and whether the queue's
    worker and the load generator run at once on the same core; the TCP sockets each server
    process holds, once, at mid-run."""

    def __init__(self, procs: list[psutil.Process], worker: psutil.Process, lg: psutil.Process, half: float):
        super().__init__(daemon=True)
        self.procs, self.worker, self.lg, self.half = procs, worker, lg, half
        self.place = {p.pid: {} for p in procs + [lg]}
        self.socks: dict[int, int] = {}
        self.both = {"same": 0, "diff": 0}
        self.stop = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self.stop.wait(SAMPLE_S):
            seen = {}
            for p in self.procs + [self.lg]:
                seen[p.pid] = _running_cores(p)
                for core in seen[p.pid]:
                    self.place[p.pid][core] = self.place[p.pid].get(core, 0) + 1
            w, g = seen[self.worker.pid], seen[self.lg.pid]
            if w and g:
                self.both["same" if set(w) & set(g) else "diff"] += 1
            if not self.socks and time.monotonic() - t0 > self.half:
                for p in self.procs:
                    try:
                        self.socks[p.pid] = len(p.net_connections(kind="tcp"))
                    except psutil.Error:
                        pass


def run_level(target, conns: int, duration: float) -> dict:
    with MemcacheClient(target.host, target.port) as c:
        c.flush(QUEUE)
        loadgen.run(Load(port=target.port, producers=1, sets=PREFILL, value_size=1024, queue=QUEUE, depth=32))
        st0 = c.stats()
    procs = target.tree.processes()
    names = {p.pid: p.name() + ("-sup" if p.pid == target.tree.root_pid else "") for p in procs}
    worker = next(p for p in procs if names[p.pid] == "lanner-w0")
    before = {p.pid: _counters(p) for p in procs}
    totals: list[int] = []
    running = loadgen.start(Load(port=target.port, conns=conns, duration=duration, get_ratio=0.5,
                                 value_size=1024, queue=QUEUE), progress=totals.append)
    sampler = Sampler(procs, worker, psutil.Process(running.procs[0].pid), duration / 2)
    sampler.start()
    res = running.wait()
    sampler.stop.set()
    sampler.join()
    after = {p.pid: _counters(p) for p in procs}
    with MemcacheClient(target.host, target.port) as c:
        st1 = c.stats()
    ops = res["ops"]
    rep = {"conns": conns, "ops_s": res["ops_per_s"], "errors": res.get("errors"),
           "handoffs": int(st1["handoffs"]) - int(st0["handoffs"]),
           "routed": int(st1["routed_requests"]) - int(st0["routed_requests"]),
           "rates_250ms": [(b - a) * 4 for a, b in zip([0] + totals, totals)],
           "w0_lg_running": sampler.both, "load": os.getloadavg()[0], "procs": {}}
    for p in procs:
        (u0, s0, v0, n0), (u1, s1, v1, n1) = before[p.pid], after[p.pid]
        cpu = (u1 - u0) + (s1 - s0)
        rep["procs"][names[p.pid]] = {"cpu_s": round(cpu, 2), "us_op": round(cpu * 1e6 / ops, 2) if ops else None,
                                      "vcs": v1 - v0, "nvcs": n1 - n0, "socks": sampler.socks.get(p.pid),
                                      "run_on": sampler.place[p.pid], "user_s": u1 - u0, "sys_s": s1 - s0}
    rep["loadgen_run_on"] = sampler.place[sampler.lg.pid]
    rep["loadgen_rusage"] = {k: res[k] for k in res.raw if "cpu" in k or "rusage" in k}
    return rep


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m lanner.perf.drop_probe ROUNDS DURATION TAG", file=sys.stderr)
        return 2
    rounds, duration, tag = int(argv[0]), float(argv[1]), argv[2]
    target = start_lanner()
    try:
        for r in range(rounds):
            reps = []
            for conns in (100, 1000):
                rep = run_level(target, conns, duration)
                rep["round"] = r
                reps.append(rep)
                print(json.dumps(rep), flush=True)
            a, b = reps[0]["ops_s"], reps[1]["ops_s"]
            print(f"# {tag} round {r}: c=100 {a:.0f} c=1000 {b:.0f} drop {100 * (1 - b / a):.1f} % "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        target.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
