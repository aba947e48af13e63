"""The cleaner process: journal packs and command-log segment rewrites, off the workers' loops.

Workers send `pack` requests (files up to a checkpoint, the output path) over their
socketpair and carry on serving; the cleaner runs the pure pack function
(packer.py) on a thread, replies `packed`, and the worker's journal adopts the `.pack` file.
On its own timer (`[cmdlog] clean_interval`) it rewrites the closed segments of
every command-log partition (rewrite.py), which never touch a segment a worker
appends to.  Everything it writes goes to a temporary name first, so a killed
cleaner leaves only temporaries, which the next pack or rewrite ignores or removes.
"""
from __future__ import annotations

import logging
import os
import selectors
import signal
import threading
import time

from lanner.clock import SYSTEM_CLOCK
from lanner.ipc import control
from lanner.ipc.fdwait import wait_readable
from lanner.server.heaptrim import release_free_heap
from lanner.storage.cmdlog.rewrite import rewrite_segments
from lanner.storage.journal.packer import pack_files

log = logging.getLogger(__name__)


def run_pack(msg: dict, heart=None) -> dict:
    """Pack on a thread of the cleaner while its main thread keeps the heart beating: a long
    pack is work, not a stuck loop, and a pack thread blocked in a read or in the final fsync of
    a big pack does not stop the beat.  Not in a forked child (until stop 21): the child's
    copy-on-write (about 1 MB for a fork that does nothing, then every pymalloc pool and heap
    page the pack allocates into) made the cleaner and its pack 6.1 MB of private memory at
    `perf memory`'s peak, where the worker holds `max_memory_size` of items, against 4.5 MB in
    one process.  The pack's buffers are bounded (codec.CHUNK), and what it allocated goes back
    to the OS when it is done (heaptrim.release_free_heap).  A pack that raises is reported, not
    raised; the worker asks again later."""
    t0 = time.monotonic()
    failed: list[str] = []

    def pack() -> None:
        try:
            pack_files(msg["files"], msg["out"], msg.get("open_xids"),
                       now_ms=time.time_ns() // 1_000_000)
        except BaseException as e:
            log.exception("cleaner: pack into %s failed", msg.get("out"))
            failed.append(repr(e))

    thread = threading.Thread(target=pack, name="lanner-pack", daemon=True)
    thread.start()
    while thread.is_alive():
        if heart is not None:
            heart.beat(time.monotonic())
        thread.join(heart.interval if heart is not None else None)
    release_free_heap()
    if failed:
        return {"cmd": "packed", "id": msg["id"], "ok": False, "error": f"pack failed: {failed[0]}"}
    log.info("cleaner: packed %d file(s) into %s in %.2fs", len(msg["files"]), msg["out"],
             time.monotonic() - t0)
    return {"cmd": "packed", "id": msg["id"], "ok": True, "out_path": msg["out"]}


def _wait_beating(pid: int, heart) -> int:
    """waitpid(pid), stamping `heart` meanwhile (a pidfd turns readable when the child exits)."""
    if heart is None:
        return os.waitpid(pid, 0)[1]
    pidfd = os.pidfd_open(pid)
    try:
        while True:
            heart.beat(time.monotonic())
            if wait_readable((pidfd,), heart.interval):
                return os.waitpid(pid, 0)[1]
    finally:
        os.close(pidfd)


def run_rewrites(queue_path: str, heart=None) -> bool:
    """Rewrite every partition in a forked child: what a rewrite allocates goes back to the OS
    when the child exits, and a crash takes only the child with it.  The heart keeps beating
    meanwhile, because a rewrite of many partitions can outlast the heartbeat timeout and the
    supervisor would kill a cleaner that is only busy."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            rewrite_all(queue_path, SYSTEM_CLOCK)
            code = 0
        except BaseException:
            log.exception("cleaner: rewriting the command logs under %s failed", queue_path)
        finally:
            logging.shutdown()
            os._exit(code)
    status = _wait_beating(pid, heart)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def rewrite_all(queue_path: str, clock) -> None:
    root = os.path.join(queue_path, "cmdlog")
    if not os.path.isdir(root):
        return
    for entry in sorted(os.listdir(root)):
        d = os.path.join(root, entry)
        if entry.isdigit() and os.path.isdir(d):
            try:
                stats = rewrite_segments(d, clock)
                log.info("cleaner: rewrote %s: %s", d, stats)
            except Exception:
                log.exception("cleaner: rewrite of %s failed; it will be retried", d)


def cleaner_main(config, worker_socks, control_sock, heart=None) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    sel = selectors.DefaultSelector()
    wake_r, wake_w = os.pipe()          # a signal must cut the (long) select short
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    sel.register(wake_r, selectors.EVENT_READ, "signal")
    readers = {}
    for i, s in enumerate(worker_socks):
        readers[i] = control.Reader(s)
        sel.register(s, selectors.EVENT_READ, i)
    ctl = control.Reader(control_sock)
    sel.register(control_sock, selectors.EVENT_READ, "control")
    control.send(control_sock, {"cmd": "ready", "cleaner": 0})
    interval = config.cmdlog.clean_interval / 1000.0
    next_clean = time.monotonic() + interval
    beat_every = heart.interval if heart is not None else None
    while not stopping:
        now = time.monotonic()
        if heart is not None:
            heart.beat(now)
        timeout = max(0.0, next_clean - now)
        if beat_every is not None:
            timeout = min(timeout, beat_every)     # an idle wait still beats the heart
        for key, _ in sel.select(timeout):
            if key.data == "signal":
                os.read(wake_r, 512)
                continue
            if key.data == "control":
                ctl.read()
                if ctl.eof:
                    stopping.append(1)
                continue
            reader = readers[key.data]
            for msg in reader.read():
                if msg.get("cmd") == "pack":
                    try:
                        control.send(worker_socks[key.data], run_pack(msg, heart))
                    except OSError:
                        pass          # that worker died; its successor will ask again
            if reader.eof:
                sel.unregister(worker_socks[key.data])
        if time.monotonic() >= next_clean:
            if os.path.isdir(os.path.join(config.server.queue_path, "cmdlog")):
                run_rewrites(config.server.queue_path, heart)
            next_clean = time.monotonic() + interval
    return 0
