"""What every scenario needs while it runs: the target, one measured loadgen run, setup helpers.

`measure()` brackets a loadgen run with CPU readings of the server's processes, so every row
carries the client's CPU per op next to the server's: on a 2-core box the reader must be able
to see whether the client, rather than the server, was the bottleneck.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass

from lanner.perf import loadgen
from lanner.perf.client import MemcacheClient
from lanner.perf.report import Report, progress_bar
from lanner.perf.servers import Target


class ScenarioError(RuntimeError):
    """The scenario cannot run as asked (wrong kind of server, nothing listening, bad options)."""


@dataclass(slots=True)
class Context:
    target: Target
    procs: int = 1
    progress: bool = True

    def measure(self, load: loadgen.Load, desc: str, expect_ops: int | None = None) -> tuple[dict, loadgen.Result]:
        """Run one load against the target; return its table row and the raw result."""
        load = dataclasses.replace(load, host=self.target.host, port=self.target.port,
                                   procs=load.procs if load.procs > 1 else self.procs)
        bar = progress_bar(expect_ops, desc, self.progress, unit="op")

        def on_progress(n: int) -> None:
            bar.n = n
            bar.refresh()

        tree = self.target.tree
        roles0 = tree.cpu_by_role() if tree else None
        try:
            res = loadgen.run(load, progress=on_progress)
        finally:
            bar.close()
        roles = None
        if tree:
            roles1 = tree.cpu_by_role()
            roles = {r: s - roles0.get(r, 0.0) for r, s in roles1.items()}
        return row_from(res, roles), res

    def require_queues(self, scenario: str) -> None:
        if not self.target.queues:
            raise ScenarioError(f"{scenario} needs queue semantics; {self.target.name} is a plain "
                                f"key-value cache ({self.target.kind})")

    def client(self, timeout: float | None = 10.0) -> MemcacheClient:
        try:
            return MemcacheClient(self.target.host, self.target.port, timeout)
        except OSError as e:
            raise ScenarioError(f"cannot connect to {self.target.host}:{self.target.port}: {e}") from None

    def flush(self, *queues: str) -> None:
        """Empty the queues first, as Kestrel's load tests do; memcached has no `flush <key>`."""
        if not self.target.queues:
            return
        with self.client() as c:
            for q in queues:
                c.flush(q)

    def queue_stats(self, queue: str) -> dict:
        if not self.target.queues:
            return {}
        with self.client() as c:
            stats = c.stats()
        prefix = f"queue_{queue}_"
        return {k[len(prefix):]: v for k, v in stats.items() if k.startswith(prefix)}


def row_from(res: loadgen.Result, server_roles: dict[str, float] | None) -> dict:
    """`server_roles`: the server's CPU seconds during the run per process role (or None)."""
    lat = res["latency_us"]
    ops = res["ops"]
    server_cpu_s = sum(server_roles.values()) if server_roles is not None else None
    return {
        "ops": ops, "elapsed_s": round(res["elapsed_s"], 4), "ops_s": round(res["ops_per_s"], 1),
        "items_s": round(res["items_per_s"], 1),
        "p50_us": lat["p50"], "p90_us": lat["p90"], "p99_us": lat["p99"], "p999_us": lat["p999"],
        "max_us": lat["max"], "mean_us": lat["mean"],
        "set_p99_us": res["set_latency_us"]["p99"], "get_p99_us": res["get_latency_us"]["p99"],
        "client_us_op": round(res["cpu_us_per_op"], 2),
        "server_us_op": round(server_cpu_s * 1e6 / ops, 2) if server_cpu_s is not None and ops else None,
        "server_us_op_by_role": ({r: round(s * 1e6 / ops, 2) for r, s in sorted(server_roles.items()) if s > 0}
                                 if server_roles is not None and ops else None),
        "client_cpu_s": round(res["cpu_user_s"] + res["cpu_sys_s"], 4),
        "server_cpu_s": round(server_cpu_s, 4) if server_cpu_s is not None else None,
        "conns": res["conns"], "depth": res["depth"], "value_size": res["value_size"],
        "hits": res["hits"], "misses": res["misses"], "not_stored": res["not_stored"],
        "errors": res["errors"], "timed_out": res["timed_out"],
    }


def check_clean(report: Report, res: loadgen.Result, label: str) -> None:
    """Every loadgen run must finish without protocol errors, refusals or a timeout."""
    problems = []
    if res["errors"]:
        problems.append(f"{res['errors']} errors (first: {res['first_error']})")
    if res["not_stored"]:
        problems.append(f"{res['not_stored']} NOT_STORED")
    if res["timed_out"]:
        problems.append("timed out")
    report.check(f"{label}: clean", not problems, "; ".join(problems) or "no errors")


def check_payloads(report: Report, res: loadgen.Result, label: str, expected: int | None) -> None:
    """Payload checks of a verifying run: intact, not duplicated, in order, and (if given) all there."""
    v = res["verify"]
    problems = [f"{v[k]} {k.replace('_', ' ')}" for k in ("bad_payload", "duplicates", "out_of_order", "unexpected")
                if v[k]]
    if expected is not None and v["distinct"] != expected:
        problems.append(f"{v['distinct']} distinct items read of {expected} expected "
                        f"({expected - v['distinct']} missing)")
    report.check(f"{label}: payloads", not problems,
                 "; ".join(problems) or f"{v['checked']} items checked, all intact and in order")


def run_threads(threads: list[threading.Thread], deadline: float) -> float:
    """Start the client threads of a threaded scenario, join them until `deadline` (plus a 5 s
    grace for the last in-flight request), and return the seconds they ran: a hung client then
    costs the run its deadline, not forever."""
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + 5.0)
    return time.monotonic() - started
