"""Bytecodes and Python calls per request, per function, on the hot loop's rig: where a
request's interpreter work goes, exactly and at once (callgrind gives instructions, but per C
function; half of them are in the eval loop itself, which names no Python function).

`python -m lanner.perf.hotloop --opcodes [rig options]` runs the rig's turns (hotloop.py's
Workload: the same requests, replies checked) under `sys.settrace` with `f_trace_opcodes` on
every frame, and prints, per function, the bytecodes it ran and how often it was called, each
divided by the requests.  Only Python frames count: a compiled module's functions (the parser,
counters, the clock: compiled.py) and C calls do not show.  A bytecode costs ~29 instructions
and a Python call 150-300 here (perf/README.md), so `bytecodes * 29 + calls * 200` roughly
predicts what a cut gains before callgrind measures it.
"""
from __future__ import annotations

import os
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field

from lanner.perf.hotloop import Rig, Workload

#: functions printed, most bytecodes first
TOP = 40


@dataclass
class Profile:
    """Counts over `requests` requests, keyed by (file relative to the package, function)."""

    requests: int
    bytecodes: Counter = field(default_factory=Counter)
    calls: Counter = field(default_factory=Counter)

    def per_request(self) -> tuple[float, float]:
        """(bytecodes, calls) per request over all functions."""
        return (sum(self.bytecodes.values()) / self.requests, sum(self.calls.values()) / self.requests)

    def rows(self, top: int = TOP) -> list[tuple[float, float, str]]:
        """(bytecodes, calls, 'file:function') per request, most bytecodes first; not the
        functions that ran a few times in all (the rig's set-up and tear-down)."""
        n = self.requests
        return [(ops / n, self.calls[key] / n, "%s:%s" % key) for key, ops in self.bytecodes.most_common(top)
                if ops * 20 >= n]

    def report(self, top: int = TOP) -> str:
        ops, calls = self.per_request()
        lines = ["opcodes: %d requests: %.1f bytecodes, %.2f Python calls per request" % (self.requests, ops, calls),
                 "%9s %7s  %s" % ("bytecodes", "calls", "function")]
        lines += ["%9.1f %7.2f  %s" % row for row in self.rows(top)]
        return "\n".join(lines)


def _short(filename: str, root: str = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) -> str:
    """A path under the repository (engine/..., perf/...) as itself, another one whole."""
    return os.path.relpath(filename, root) if filename.startswith(root + os.sep) else filename


def trace(run) -> tuple[Counter, Counter]:
    """Bytecodes and calls per (file, function) of the Python frames `run()` executes in this
    thread."""
    bytecodes: Counter = Counter()
    calls: Counter = Counter()
    names: dict = {}                 # code object -> key (one relpath per function, not per event)

    def key_of(code):
        key = names.get(code)
        if key is None:
            key = names[code] = (_short(code.co_filename), code.co_qualname)
        return key

    def tracer(frame, event, arg):
        if event == "opcode":
            bytecodes[key_of(frame.f_code)] += 1
        elif event == "call":
            frame.f_trace_opcodes = True
            calls[key_of(frame.f_code)] += 1
        return tracer

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return bytecodes, calls


def profile(requests: int, conns: int, size: int, depth: int, prefill: int = 0, config_file=None,
            warmup_turns: int = 50) -> Profile:
    """The rig's turns for `requests` requests after `warmup_turns` untraced ones (the
    interpreter's specialisation settles, as in a server that has run a while)."""
    with tempfile.TemporaryDirectory(prefix="lanner-opcodes-") as folder:
        rig = Rig(folder, conns, config_file=config_file)
        try:
            warm = Workload(rig, warmup_turns * conns * depth, size, depth, prefill)
            rig.run_turns(warm.turns, warm.feed)
            warm.check()
            load = Workload(rig, requests, size, depth)
            bytecodes, calls = trace(lambda: rig.run_turns(load.turns, load.feed))
            load.check()
            return Profile(load.requests, bytecodes, calls)
        finally:
            rig.close()
