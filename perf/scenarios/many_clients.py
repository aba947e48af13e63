"""many-clients (Kestrel's ManyClients): one producer trickles N items (one every -s ms) while many
consumers wait on `get q/t=1000`, optionally transactionally (`/close/open`, -x), optionally
hanging up on K% of their reads right after sending them (-k, implies -x), before reading the
reply.  Checks that every item was delivered, none lost, and none delivered twice unless the
reads were transactional (where a read cut off by a hang-up is legitimately redelivered).
Reports the put-to-read delivery latency.  Correctness, not load: Python threads suffice.
"""
from __future__ import annotations

import collections
import random
import socket
import sys
import threading
import time

from lanner.perf.client import ProtocolError
from lanner.perf.context import ScenarioError, run_threads
from lanner.perf.report import Plot, Report
from lanner.perf.scenarios import add_options

NAME = "many-clients"
HELP = "a trickling producer and many blocking consumers; nothing lost, optional hang-ups"
COMPARE = None

LYRIC = (b"crossed off, but never forgotten\nmisplaced, but never losing hold\n"
         b"these are the moments that bind us\nrepressed, but never erased\n")


def add_arguments(p) -> None:
    g = p.add_argument_group("many-clients (Kestrel's names and defaults)")
    g.add_argument("-s", "--sleep", type=float, default=100, help="milliseconds between puts (default 100)")
    add_options(g, count=100, queue="spam", clients=(100, "consumers"))
    g.add_argument("-k", "--kill", type=int, default=0, metavar="PERCENT",
                   help="hang up on PERCENT %% of reads before reading the reply (implies -x)")
    g.add_argument("-x", "--transactions", action="store_true", help="transactional reads (/close/open)")
    add_options(g, no_flush=True)
    g.add_argument("-M", "--monitor", action="store_true", help="print queue stats every second to stderr")
    add_options(g, seed=(1, "random seed for hang-ups"),
                timeout=(None, "give up after this many seconds (default: trickle time + 60)"))


class State:
    """Shared between the producer and consumer threads; every field is guarded by `lock`."""

    def __init__(self, count: int):
        self.lock = threading.Lock()
        self.count = count
        self.got = 0
        self.deliveries: collections.Counter = collections.Counter()
        self.put_at: dict[int, float] = {}
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.misses = self.hangups = self.bad = 0

    def done(self) -> bool:
        with self.lock:
            return self.got >= self.count


def run(args, ctx) -> Report:
    ctx.require_queues(NAME)
    transactions = args.transactions or args.kill > 0
    timeout = args.timeout or args.count * args.sleep / 1000.0 + 60.0
    report = Report(NAME, {"count": args.count, "clients": args.clients, "sleep_ms": args.sleep,
                           "kill_percent": args.kill, "transactions": transactions, "queue": args.queue},
                    ctx.target.describe(),
                    columns=[("items", "items", "{:,}"), ("items_s", "items/s", "{:,.1f}"),
                             ("p50_ms", "p50 ms", "{:,.1f}"), ("p99_ms", "p99 ms", "{:,.1f}"),
                             ("max_ms", "max ms", "{:,.1f}"), ("hangups", "hang-ups", "{:,}"),
                             ("misses", "timeouts", "{:,}"), ("redelivered", "redelivered", "{:,}"),
                             ("lost", "lost", "{:,}")])
    if not args.no_flush:
        ctx.flush(args.queue)
    before = ctx.queue_stats(args.queue)
    st = State(args.count)
    deadline = time.monotonic() + timeout
    stop = threading.Event()
    suffix = "/t=1000" + ("/close/open" if transactions else "")
    threads = [threading.Thread(target=_consume, args=(ctx, st, args, k, suffix, transactions, deadline), daemon=True)
               for k in range(args.clients)]
    threads.append(threading.Thread(target=_produce, args=(ctx, st, args, stop), daemon=True))
    if args.monitor:
        threading.Thread(target=_monitor, args=(ctx, args.queue, stop), daemon=True).start()
    elapsed = run_threads(threads, deadline)
    stop.set()
    after = ctx.queue_stats(args.queue)

    lost = [i for i in range(args.count) if st.deliveries[i] == 0]
    twice = [i for i, n in st.deliveries.items() if n > 1]
    lat = sorted(st.latencies)
    report.rows.append({
        "label": f"c={args.clients}", "items": sum(st.deliveries.values()), "elapsed_s": round(elapsed, 3),
        "items_s": round(sum(st.deliveries.values()) / elapsed, 2) if elapsed else None,
        "p50_ms": _pct(lat, 0.5), "p99_ms": _pct(lat, 0.99), "max_ms": round(lat[-1], 2) if lat else None,
        "hangups": st.hangups, "misses": st.misses, "redelivered": len(twice), "lost": len(lost),
        "server_canceled": _delta(before, after, "canceled_transactions"),
        "left_in_queue": _int(after.get("items")),
    })
    report.check("nothing lost", not lost,
                 f"{len(lost)} items never delivered" + (f", e.g. {lost[:10]}" if lost else ""))
    if transactions:
        report.check("redelivery", True, f"{len(twice)} items seen twice (allowed: transactional reads)")
    else:
        report.check("exactly once", not twice, f"{len(twice)} items delivered more than once")
    report.check("payloads", st.bad == 0, f"{st.bad} replies were not items this run put")
    report.check("no errors", not st.errors, "; ".join(st.errors[:3]) or "no errors")
    if after.get("items") is not None:
        report.check("queue drained", _int(after.get("items")) == 0, f"{after.get('items')} items left in the queue")
    report.plots.append(Plot("delivery.png", "label", ["p50_ms", "p99_ms", "max_ms"], "", "put-to-read latency (ms)",
                             f"many-clients: {args.clients} consumers, one put every {args.sleep:g} ms", kind="bar"))
    return report


def _produce(ctx, st: State, args, stop: threading.Event) -> None:
    try:
        with ctx.client() as c:
            for i in range(args.count):
                if stop.is_set():
                    return
                with st.lock:
                    st.put_at[i] = time.monotonic()
                if not c.set(args.queue, b"%08x:" % i + LYRIC):
                    with st.lock:
                        st.errors.append(f"set of item {i} to {args.queue}: NOT_STORED")
                if args.sleep:
                    time.sleep(args.sleep / 1000.0)
    except (OSError, ProtocolError, ScenarioError) as e:
        with st.lock:
            st.errors.append(f"producer: {e}")


def _consume(ctx, st: State, args, k: int, suffix: str, transactions: bool, deadline: float) -> None:
    rng = random.Random(args.seed * 100003 + k)
    request = f"get {args.queue}{suffix}\r\n".encode()
    c = None
    try:
        while not st.done() and time.monotonic() < deadline:
            if c is None:
                c = ctx.client(timeout=30.0)
            c.send(request)
            if rng.randrange(100) < args.kill:
                c.sock.shutdown(socket.SHUT_RDWR)
                c.close()
                c = None
                with st.lock:
                    st.hangups += 1
                continue
            data = c.read_value(f"get {args.queue}{suffix}")
            now = time.monotonic()
            with st.lock:
                if data is None:
                    st.misses += 1
                    continue
                try:
                    item = int(data[:8], 16)
                except ValueError:
                    item = -1
                if item < 0 or item >= st.count or data[8:] != b":" + LYRIC:
                    st.bad += 1
                    continue
                st.deliveries[item] += 1
                st.got += 1
                st.latencies.append((now - st.put_at.get(item, now)) * 1000.0)
        if c is not None and transactions:
            c.send(f"get {args.queue}/close\r\n".encode())
            if c.read_value(f"get {args.queue}/close") is not None:
                raise ProtocolError(f"get {args.queue}/close returned an item")
    except (OSError, ProtocolError, ScenarioError) as e:
        with st.lock:
            st.errors.append(f"consumer {k}: {e}")
    finally:
        if c is not None:
            c.close()


def _monitor(ctx, queue: str, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        try:
            s = ctx.queue_stats(queue)
        except (OSError, ProtocolError, ScenarioError):
            continue
        print(f"{queue}: items={s.get('items')} waiters={s.get('waiters')} "
              f"open_transactions={s.get('open_transactions')} total_items={s.get('total_items')}", file=sys.stderr)


def _pct(values: list[float], p: float):
    return round(values[min(int(p * len(values)), len(values) - 1)], 2) if values else None


def _int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _delta(before: dict, after: dict, key: str):
    a, b = _int(after.get(key)), _int(before.get(key))
    return a - b if a is not None and b is not None else None
