"""Where a process's memory lives, by mapping kind (/proc/PID/smaps): the memory scenario's
peak says how much, this says what, so a cut can aim at the kind that grew.

Kinds: `heap` (brk: glibc's small allocations, bytes objects of an item), `anon` (anonymous
mmaps: pymalloc's arenas, malloc's mmapped chunks and other arenas, big buffers), `stack`
(the main thread's), `shm` (/dev/shm rings and counters, memfd), `libpython`, `lanner .so`
(the compiled modules), `ext .so` (other extension modules: uvloop, psutil, msgpack...), `libs`
(libc and the other system libraries), `file` (anything else mapped from a file).  Per kind:
PSS, and USS (Private_Clean + Private_Dirty: what the process alone holds, which removing or
slimming it saves).  `python -m lanner.perf.smaps PID...` prints the table for a running tree.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import psutil

KB = 1024
MB = 2**20
_FIELDS = ("Pss", "Private_Clean", "Private_Dirty")


def kind_of(path: str) -> str:
    if path == "[heap]":
        return "heap"
    if path.startswith("[stack"):
        return "stack"
    if path.startswith("["):          # [vvar], [vdso], [vsyscall]
        return "kernel"
    if not path:
        return "anon"
    if path.startswith(("/dev/shm/", "/memfd:", "/SYSV")) or "(deleted)" in path and "/shm" in path:
        return "shm"
    base = os.path.basename(path)
    if base.startswith("libpython"):
        return "libpython"
    if ".so" in base:
        if "/lanner/" in path or "/engine/" in path or "/protocols/" in path:
            return "lanner .so"
        if "site-packages" in path or "lib-dynload" in path:
            return "ext .so"
        return "libs"
    return "file"


@dataclass(slots=True)
class Usage:
    pss: int = 0
    uss: int = 0
    maps: int = 0

    def add(self, pss: int, uss: int) -> None:
        self.pss += pss
        self.uss += uss
        self.maps += 1


@dataclass(slots=True)
class ProcMaps:
    """One process's memory by kind, and its largest private mappings (to name the culprits)."""
    pid: int
    kinds: dict[str, Usage] = field(default_factory=dict)
    biggest: list[tuple[int, str]] = field(default_factory=list)     # (uss, "kind path perms size")

    @classmethod
    def read(cls, pid: int, keep: int = 6) -> "ProcMaps":
        out = cls(pid)
        head, vals = None, {}
        with open(f"/proc/{pid}/smaps", "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
        for line in lines + ["0-0 ---- 0 00:00 0"]:     # a sentinel header closes the last mapping
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):
                if head is not None:
                    out._close(head, vals)
                head, vals = line, {}
            else:
                name, _, rest = line.partition(":")
                if name in _FIELDS or name == "Size":
                    vals[name] = int(rest.split()[0]) * KB
        out.biggest.sort(reverse=True)
        del out.biggest[keep:]
        return out

    def _close(self, head: str, vals: dict) -> None:
        parts = head.split(None, 5)
        path = parts[5].strip() if len(parts) > 5 else ""
        kind = kind_of(path)
        uss = vals.get("Private_Clean", 0) + vals.get("Private_Dirty", 0)
        self.kinds.setdefault(kind, Usage()).add(vals.get("Pss", 0), uss)
        if uss:
            self.biggest.append((uss, f"{kind} {os.path.basename(path) or '-'} {parts[1]} "
                                      f"size {vals.get('Size', 0) // KB} kB"))

    @property
    def pss(self) -> int:
        return sum(u.pss for u in self.kinds.values())

    @property
    def uss(self) -> int:
        return sum(u.uss for u in self.kinds.values())

    def describe(self) -> str:
        """`heap 20.1/20.0 anon 6.2/6.0 ...`: PSS/USS MB per kind, largest first."""
        rows = sorted(self.kinds.items(), key=lambda kv: -kv[1].pss)
        return " ".join(f"{k} {u.pss / MB:.1f}/{u.uss / MB:.1f}" for k, u in rows if u.pss >= MB // 20)

    def to_json(self) -> dict:
        return {"pid": self.pid, "kinds": {k: {"pss": u.pss, "uss": u.uss, "maps": u.maps}
                                           for k, u in self.kinds.items()},
                "biggest": [{"uss": u, "what": w} for u, w in self.biggest]}


def read_all(pids) -> dict[int, ProcMaps]:
    out = {}
    for pid in pids:
        try:
            out[pid] = ProcMaps.read(pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue                   # it exited between the listing and the read
    return out


def main(argv: list[str]) -> int:
    pids = [int(a) for a in argv]
    if len(pids) == 1:                 # one pid: its whole tree
        pids += [c.pid for c in psutil.Process(pids[0]).children(recursive=True)]
    for pid, m in read_all(pids).items():
        try:
            name = psutil.Process(pid).name()
        except psutil.NoSuchProcess:
            name = "?"
        print(f"{pid} {name}: PSS {m.pss / MB:.1f} USS {m.uss / MB:.1f} MB | {m.describe()}")
        for uss, what in m.biggest:
            print(f"    {uss / MB:6.2f} MB private  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
