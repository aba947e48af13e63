"""Ring throughput and latency across a real fork(), as measured for the ring's design (engine/ipc/ring.py).

Producer in this process, consumer in a forked child, 64-byte payloads.  The
consumer drains everything with read_batch(64) (a memoryview per record, one
release per batch, as the worker does), and sleeps on its
eventfd (flag protocol) whenever the ring is empty; the producer publishes
every `batch` messages.  Figures: messages/s (wall) and CPU µs per message on
each side (getrusage of each process over the run).

    python -m pytest perf/bench_ring.py -o addopts="" --benchmark-only -s
    python -m lanner.perf.bench_ring     # just the table (the doc measured 0.87 M msg/s,
                                         # 1.09 + 1.09 µs, pinned, publish every 16)
"""
from __future__ import annotations

import json
import os
import resource
import select
import statistics
import sys
import time

from lanner.ipc.ring import Ring
from lanner.ipc.wake import WakeFd

PAYLOAD = 64
COUNT = 300_000
TIMEOUT = 60.0


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _pin(cpu: int | None) -> None:
    if cpu is not None and len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {cpu})


def _consume(ring: Ring, count: int, payload: int, out_fd: int, cpu: int | None) -> None:
    _pin(cpu)
    wake = WakeFd(ring.wake_fd)
    cpu0 = _cpu()
    got = sleeps = 0
    nbytes = 0
    read_batch = ring.read_batch
    while got < count:
        batch = read_batch(64)
        if not batch:
            if ring.prepare_sleep():
                sleeps += 1
                if not wake.wait(TIMEOUT):
                    raise RuntimeError(f"consumer: no wakeup after {got} messages")
                ring.clear_sleep()
                wake.drain()
            continue
        for rec in batch:               # touch each record as a worker would
            nbytes += len(rec)
        got += len(batch)
        del batch, rec
        ring.release()
    ring.release()
    if nbytes != count * payload:
        raise RuntimeError(f"consumer: {nbytes} bytes for {count} records of {payload}")
    os.write(out_fd, json.dumps({"cpu": _cpu() - cpu0, "sleeps": sleeps,
                                 "flagged": ring._hdr[1], "space_signals": ring.space_signals}).encode())


def run_throughput(count: int = COUNT, batch: int = 16, payload: int = PAYLOAD,
                   capacity: int = 1 << 20, pin: bool = False) -> dict:
    """One producer→consumer run across fork; returns the figures."""
    pw, cw = WakeFd.create(), WakeFd.create()
    ring = Ring.create(capacity, wake_fd=cw, space_fd=pw, name="bench")
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:                                            # child: consumer
        code = 0
        try:
            os.close(rfd)
            _consume(ring, count, payload, wfd, 1 if pin else None)
        except BaseException:
            code = 1
            import traceback       # lazy: only a crashing child needs it
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(wfd)
    affinity = os.sched_getaffinity(0)
    try:
        _pin(0 if pin else None)
        msg = bytes(payload)
        send = ring.send
        publish = ring.publish
        space = WakeFd(pw.fd)
        t0, cpu0 = time.perf_counter(), _cpu()
        for i in range(count):
            send(msg)
            if i % batch == batch - 1:
                publish()
        publish()
        while ring.backlog:
            if not space.wait(TIMEOUT):
                raise RuntimeError("producer: no space wakeup")
            space.drain()
            publish()
        prod_cpu = _cpu() - cpu0
        if not select.select([rfd], [], [], TIMEOUT)[0]:
            raise RuntimeError("consumer did not finish")
        wall = time.perf_counter() - t0
        child = json.loads(os.read(rfd, 4096) or b"{}")
    finally:
        os.close(rfd)
        _, status = os.waitpid(pid, 0)
        os.sched_setaffinity(0, affinity)
        for w in (pw, cw):
            w.close()
    if os.waitstatus_to_exitcode(status) != 0 or "cpu" not in child:
        raise RuntimeError(f"consumer failed (status {status})")
    return {
        "count": count, "batch": batch, "payload": payload, "pinned": pin,
        "msgs_per_s": count / wall,
        "producer_us_per_msg": prod_cpu / count * 1e6,
        "consumer_us_per_msg": child["cpu"] / count * 1e6,
        "consumer_sleeps": child["sleeps"], "sleeps_flagged": child["flagged"],
        "producer_signals": ring.signals,
        "space_signals": child["space_signals"],
    }


def _echo(req: Ring, resp: Ring, count: int) -> None:
    wake = WakeFd(req.wake_fd)
    for _ in range(count):
        while True:
            off = req.read_offset()
            if off >= 0:
                break
            if req.prepare_sleep():
                if not wake.wait(TIMEOUT):
                    raise RuntimeError("echo: no request")
                req.clear_sleep()
                wake.drain()
        resp.write(req.buf[off:off + req.rec_len])
        req.release()
        resp.publish()


def run_pingpong(count: int = 20_000, payload: int = PAYLOAD) -> dict:
    """One request outstanding, both sides sleeping when idle: RTT percentiles."""
    a, b = WakeFd.create(), WakeFd.create()
    req = Ring.create(1 << 16, wake_fd=b, space_fd=a, name="ping")
    resp = Ring.create(1 << 16, wake_fd=a, space_fd=b, name="pong")
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            _echo(req, resp, count)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    try:
        msg = bytes(payload)
        rtts = []
        clock = time.perf_counter_ns
        for _ in range(count):
            t = clock()
            req.write(msg)
            req.publish()
            while resp.read_offset() < 0:
                if resp.prepare_sleep():
                    if not a.wait(TIMEOUT):
                        raise RuntimeError("pingpong: no reply")
                    resp.clear_sleep()
                    a.drain()
            resp.release()
            rtts.append(clock() - t)
    finally:
        _, status = os.waitpid(pid, 0)
        for w in (a, b):
            w.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"echo child failed (status {status})")
    rtts.sort()
    return {"count": count, "rtt_p50_us": rtts[len(rtts) // 2] / 1000,
            "rtt_p99_us": rtts[int(len(rtts) * 0.99)] / 1000,
            "rtt_mean_us": statistics.fmean(rtts) / 1000}


# -- pytest-benchmark ------------------------------------------------------------------

def _bench(benchmark, **kw) -> None:
    runs = []
    benchmark.pedantic(lambda: runs.append(run_throughput(**kw)), rounds=3, iterations=1)
    best = max(runs, key=lambda r: r["msgs_per_s"])
    benchmark.extra_info.update(best)
    benchmark.extra_info["msgs_per_s_all"] = [round(r["msgs_per_s"]) for r in runs]
    assert all(r["count"] == kw.get("count", COUNT) for r in runs)


def test_ring_fork_64b_publish_every_16(benchmark):
    _bench(benchmark, batch=16)


def test_ring_fork_64b_publish_every_16_pinned(benchmark):
    _bench(benchmark, batch=16, pin=True)


def test_ring_fork_64b_publish_every_message(benchmark):
    _bench(benchmark, batch=1)


def test_ring_fork_pingpong_rtt(benchmark):
    out = benchmark.pedantic(run_pingpong, rounds=1, iterations=1)
    benchmark.extra_info.update(out)
    assert out["rtt_p50_us"] > 0


def main(argv: list[str]) -> int:
    rows = []
    for pin in (False, True):
        for batch in (1, 16):
            runs = [run_throughput(batch=batch, pin=pin) for _ in range(3)]
            rows.append(max(runs, key=lambda r: r["msgs_per_s"]))
    print(f"{'batch':>5} {'pinned':>6} {'M msg/s':>8} {'prod µs':>8} {'cons µs':>8} "
          f"{'sleeps':>7} {'flagged':>7} {'signals':>7}")
    for r in rows:
        print(f"{r['batch']:>5} {str(r['pinned']):>6} {r['msgs_per_s'] / 1e6:>8.3f} "
              f"{r['producer_us_per_msg']:>8.2f} {r['consumer_us_per_msg']:>8.2f} "
              f"{r['consumer_sleeps']:>7} {r['sleeps_flagged']:>7} {r['producer_signals']:>7}")
    pp = run_pingpong()
    print(f"ping-pong 64 B, sleeping both sides: RTT p50 {pp['rtt_p50_us']:.1f} µs, "
          f"p99 {pp['rtt_p99_us']:.1f} µs")
    if "--json" in argv:
        print(json.dumps({"throughput": rows, "pingpong": pp}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
