"""CPU and memory of every Lanner process: the supervisor and its children.

Read from /proc through psutil by the admin process, which answers the admin
port: the supervisor is its parent, and its children are the workers, fronts,
the admin process itself, the cleaner and the server-set process, each named by
`prctl(PR_SET_NAME)` (`lanner-w0`, `lanner-f1`, `lanner-admin`,
`lanner-cleaner`, `lanner-zk`).  The list of
children is cached and refreshed every `REFRESH` seconds or when one is gone,
so a scrape every 100 ms does not walk /proc each time.

Memory is the resident set (RSS).  The rings and the counter block are shared
memory mapped by several processes, so RSS summed over processes counts them
more than once; `uss` (memory unique to the process) is not read because it
means parsing /proc/<pid>/smaps, several milliseconds per process.
"""
from __future__ import annotations

import os
import time

import psutil

REFRESH = 5.0

_cache: dict = {"at": 0.0, "root": 0, "procs": []}


def _name(p: psutil.Process, root: int) -> str:
    if p.pid == root:
        return "supervisor"
    try:
        n = p.name()
    except psutil.Error:
        return str(p.pid)
    return n[len("lanner-"):] if n.startswith("lanner-") else n


def _procs(root: int) -> list[tuple[str, psutil.Process]]:
    now = time.monotonic()
    c = _cache
    if c["root"] != root or now - c["at"] > REFRESH or not c["procs"]:
        try:
            top = psutil.Process(root)
            kids = top.children()
        except psutil.Error:
            return []
        c["procs"] = [(_name(p, root), p) for p in [top] + kids]
        c["root"] = root
        c["at"] = now
    return c["procs"]


MAX_AGE = 1.0
_last: dict = {"at": -1e9, "root": 0, "value": []}


def snapshot(root: int | None = None, max_age: float = MAX_AGE) -> list[dict]:
    """[{name, pid, cpu_seconds, user_seconds, system_seconds, rss_bytes, vms_bytes,
    threads, open_fds}] for the supervisor (`root`, default: this process's parent) and
    its children, sorted by name.  A reading younger than `max_age` seconds is reused, so
    scrapes every 100 ms read /proc once a second (the figures move slower than that)."""
    root = os.getppid() if root is None else root
    now = time.monotonic()
    if _last["root"] == root and now - _last["at"] < max_age:
        return _last["value"]
    value = _read(root)
    _last.update(at=now, root=root, value=value)
    return value


def _read(root: int) -> list[dict]:
    out = []
    gone = False
    for name, p in _procs(root):
        try:
            with p.oneshot():
                t = p.cpu_times()
                m = p.memory_info()
                out.append({"name": name, "pid": p.pid, "cpu_seconds": t.user + t.system,
                            "user_seconds": t.user, "system_seconds": t.system,
                            "rss_bytes": m.rss, "vms_bytes": m.vms,
                            "threads": p.num_threads(), "open_fds": p.num_fds()})
        except psutil.Error:
            gone = True
    if gone:
        _cache["at"] = 0.0       # a child was replaced: find the new one next time
    out.sort(key=lambda d: (d["name"] != "supervisor", d["name"]))
    return out
