"""Build, run and parse the C load generator (`perf/loadgen.c`).

The binary is compiled with `gcc -O2` on first use into `perf/.build/` (gitignored), or into
`~/.cache/lanner-perf/` when the package directory is read-only.  Its name carries a hash of the
source, so an edited `loadgen.c` is rebuilt and two suites never race on one half-written file
(the compiler writes a temporary name that is renamed into place).

A run may be split over several loadgen processes (`procs`, at most one per core) whose JSON is
merged here: counts add up, elapsed time is the slowest process's, latency percentiles come from
the merged sparse histograms.  Payload checks keep state (seen bitmaps) inside one process, so a
verifying run always uses one process.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from lanner.perf.paths import writable

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("loadgen.c")
PERCENTILES = (("p50", 0.5), ("p75", 0.75), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99),
               ("p999", 0.999), ("p9999", 0.9999))
SUM_KEYS = ("ops", "conns", "sets", "stored", "not_stored", "gets", "hits", "misses", "closes", "errors",
            "connect_failures", "bytes_out", "bytes_in", "cpu_user_s", "cpu_sys_s")
VERIFY_KEYS = ("checked", "bad_payload", "duplicates", "out_of_order", "unexpected", "distinct")


class LoadgenError(RuntimeError):
    """The load generator could not run (no compiler, cannot connect, bad options)."""


@dataclass(slots=True)
class Load:
    """One load-generator invocation; field names mirror loadgen.c's options."""
    host: str = "127.0.0.1"
    port: int = 22133
    producers: int = 0
    consumers: int = 0
    conns: int = 0
    sets: int | None = None
    gets: int | None = None
    get_ratio: float | None = None
    duration: float | None = None
    timeout: float | None = None
    stop_grace: float | None = None
    stall: float | None = None
    depth: int = 1
    value_size: int = 64
    queue: str = "spam"
    queues: int = 1
    get_suffix: str = ""
    until_hits: bool = False
    verify: bool = False
    expect_producers: int = 0
    expect_count: int = 0
    expect_seq_base: int = 0
    strict_order: bool = False
    producer_base: int = 0
    seq_base: int = 0
    procs: int = 1
    pause_after: tuple[int, ...] = ()   # phase sizes; Running's on_pause runs between them


    def argv(self, binary: str, progress: bool = False) -> list[str]:
        a = [binary, "--host", self.host, "--port", str(self.port), "--depth", str(self.depth),
             "--value-size", str(self.value_size), "--queue", self.queue, "--queues", str(self.queues)]
        for name in ("producers", "consumers", "conns"):
            if getattr(self, name):
                a += [f"--{name}", str(getattr(self, name))]
        for name in ("sets", "gets", "get_ratio", "duration", "timeout", "stop_grace", "stall"):
            value = getattr(self, name)
            if value is not None:
                a += ["--" + name.replace("_", "-"), str(value)]
        if self.get_suffix:
            a += ["--get-suffix", self.get_suffix]
        if self.until_hits:
            a.append("--until-hits")
        if self.verify:
            a += ["--verify", "--expect-producers", str(self.expect_producers),
                  "--expect-count", str(self.expect_count), "--expect-seq-base", str(self.expect_seq_base)]
            if self.strict_order:
                a.append("--strict-order")
        if self.producer_base:
            a += ["--producer-base", str(self.producer_base)]
        if self.seq_base:
            a += ["--seq-base", str(self.seq_base)]
        if self.pause_after:
            a += ["--pause-after", ",".join(str(n) for n in self.pause_after)]
        if progress:
            a.append("--progress")
        return a


@dataclass(slots=True)
class Result:
    """Parsed (and, for several processes, merged) loadgen output."""
    raw: dict
    per_process: list[dict] = field(default_factory=list)

    def __getitem__(self, key):
        return self.raw[key]

    def get(self, key, default=None):
        return self.raw.get(key, default)

    def summary(self) -> dict:
        """The JSON-friendly part: everything except the sparse histograms."""
        return {k: v for k, v in self.raw.items() if not k.startswith("hist_")}


def build_dir() -> Path:
    here = SOURCE.parent / ".build"
    if writable(here):
        return here
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lanner-perf"
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def ensure_built(source: Path | None = None) -> str:
    """Compile `source` (loadgen.c, or another single-file C tool of perf/: standin.c) if this
    exact source has no binary yet; return the binary's path."""
    source = source or SOURCE
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    target = build_dir() / f"{source.stem}-{digest}"
    if target.exists():
        return str(target)
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise LoadgenError(f"no C compiler found (install gcc) to build {source}")
    fd, tmp = tempfile.mkstemp(prefix=f"{source.stem}-", dir=target.parent)
    os.close(fd)
    proc = subprocess.run([cc, "-O2", "-Wall", "-o", tmp, str(source)], capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise LoadgenError(f"building {source} failed:\n{proc.stderr[-3000:]}")
    os.replace(tmp, target)
    log.info("built %s", target)
    return str(target)


def split(load: Load, procs: int) -> list[Load]:
    """Divide connections and budgets between `procs` processes, as evenly as integers allow."""
    if procs <= 1 or load.verify:
        return [load]
    total_conns = load.producers + load.consumers + load.conns
    procs = max(1, min(procs, total_conns))
    parts = []
    for i in range(procs):
        part = dataclasses.replace(load, procs=1, producers=_share(load.producers, procs, i),
                                   consumers=_share(load.consumers, procs, i), conns=_share(load.conns, procs, i))
        if part.producers + part.consumers + part.conns == 0:
            continue
        part.producer_base = load.producer_base + sum(_share(load.producers, procs, j) for j in range(i))
        if load.sets is not None:
            part.sets = _share(load.sets, procs, i)
        if load.gets is not None:
            part.gets = _share(load.gets, procs, i)
        parts.append(part)
    return parts


def _share(total: int, n: int, i: int) -> int:
    return total // n + (1 if i < total % n else 0)


class Running:
    """Load-generator processes in flight; `wait()` collects them, `stop()` ends them early.
    With `load.pause_after`, `on_pause(responses)` is called at each pause (every connection
    idle and open, all replies in) and the run goes on when it returns; one process only."""

    def __init__(self, load: Load, progress=None, on_pause=None):
        binary = ensure_built()
        parts = split(load, load.procs)
        if load.pause_after and len(parts) > 1:
            raise LoadgenError("a run with pauses is one loadgen process (procs=1)")
        self._on_pause = on_pause
        stdin = subprocess.PIPE if load.pause_after else None
        self.procs = [subprocess.Popen(p.argv(binary, progress is not None), stdin=stdin, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True) for p in parts]
        self.counts = [0] * len(self.procs)
        self.failed: BaseException | None = None
        self.errs: list[list[str]] = [[] for _ in self.procs]
        self.started = threading.Event()    # first progress line, or the process ended
        self._lock = threading.Lock()
        self._progress = progress
        self.threads = [threading.Thread(target=self._pump, args=(i, p.stderr), daemon=True)
                        for i, p in enumerate(self.procs)]
        for t in self.threads:
            t.start()

    def _pump(self, i: int, stream) -> None:
        try:
            self._read_stderr(i, stream)
        except BaseException as e:      # an on_pause that failed: end the run, wait() reports it
            self.failed = e
            self.procs[i].kill()
        finally:
            self.started.set()

    def _read_stderr(self, i: int, stream) -> None:
        for line in stream:
            if line.startswith("progress "):
                with self._lock:
                    self.counts[i] = int(line.split()[1])
                    total = sum(self.counts)
                self.started.set()
                if self._progress is not None:
                    self._progress(total)
            elif line.startswith("paused ") and self.procs[i].stdin is not None:
                if self._on_pause is not None:
                    self._on_pause(int(line.split()[1]))
                self.procs[i].stdin.write("\n")
                self.procs[i].stdin.flush()
            else:
                self.errs[i].append(line)

    def stop(self) -> Result:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        return self.wait()

    def wait(self) -> Result:
        outputs = [p.stdout.read() for p in self.procs]
        for p in self.procs:
            p.wait()
            p.stdout.close()
        for t in self.threads:
            t.join()
        for p in self.procs:
            p.stderr.close()
            if p.stdin is not None:
                p.stdin.close()
        if self.failed is not None:
            raise self.failed
        results = []
        for p, out, err in zip(self.procs, outputs, self.errs):
            try:
                data = json.loads(out)
            except json.JSONDecodeError:
                raise LoadgenError(f"loadgen exited {p.returncode} without a result: {out[-500:]!r} "
                                   f"{''.join(err)[-500:]}") from None
            if "error" in data:
                raise LoadgenError(data["error"])
            results.append(data)
        return Result(merge(results), results)


def start(load: Load, progress=None) -> Running:
    """Start a load in the background (e.g. the large-item flood of `fairness`)."""
    return Running(load, progress)


def run(load: Load, progress=None, on_pause=None) -> Result:
    """Run one load (maybe over several processes) and return the merged result.

    `progress`, if given, is called with the total responses so far (summed over processes),
    fed from the loadgen's `--progress` lines on stderr; `on_pause`: see Running.
    """
    return Running(load, progress, on_pause).wait()


def merge(results: list[dict]) -> dict:
    """Combine the outputs of processes that ran side by side."""
    if len(results) == 1:
        return results[0]
    out = dict(results[0])
    for key in SUM_KEYS:
        out[key] = sum(r[key] for r in results)
    out["elapsed_s"] = max(r["elapsed_s"] for r in results)
    out["timed_out"] = any(r["timed_out"] for r in results)
    out["first_error"] = next((r["first_error"] for r in results if r["first_error"]), "")
    out["verify"] = {**results[0]["verify"], **{k: sum(r["verify"][k] for r in results) for k in VERIFY_KEYS}}
    elapsed = out["elapsed_s"] or 1e-9
    out["ops_per_s"] = out["ops"] / elapsed
    out["items_per_s"] = out["hits"] / elapsed
    out["cpu_us_per_op"] = (out["cpu_user_s"] + out["cpu_sys_s"]) * 1e6 / out["ops"] if out["ops"] else 0.0
    out["hist_set"] = merge_hist([r["hist_set"] for r in results])
    out["hist_get"] = merge_hist([r["hist_get"] for r in results])
    out["set_latency_us"] = percentiles(out["hist_set"])
    out["get_latency_us"] = percentiles(out["hist_get"])
    out["latency_us"] = percentiles(merge_hist([out["hist_set"], out["hist_get"]]))
    return out


def merge_hist(hists: list[list[list[int]]]) -> list[list[int]]:
    acc: dict[int, int] = {}
    for h in hists:
        for value, count in h:
            acc[value] = acc.get(value, 0) + count
    return [[v, acc[v]] for v in sorted(acc)]


def percentiles(hist: list[list[int]]) -> dict:
    """Percentiles of a sparse [[lower_bound_us, count], ...] histogram, as loadgen.c computes them."""
    n = sum(c for _, c in hist)
    out = {"n": n, "min": hist[0][0] if hist else 0, "max": hist[-1][0] if hist else 0,
           "mean": round(sum(v * c for v, c in hist) / n, 1) if n else 0.0}
    for name, p in PERCENTILES:
        out[name] = _rank(hist, n, p)
    return out


def _rank(hist: list[list[int]], n: int, p: float) -> int:
    if n == 0:
        return 0
    rank = min(max(math.ceil(p * n - 1e-9) - 1, 0), n - 1)     # nearest rank, as loadgen.c
    seen = 0
    for value, count in hist:
        seen += count
        if seen > rank:
            return value
    return hist[-1][0]
