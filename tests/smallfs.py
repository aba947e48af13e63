"""A small filesystem a test can fill: a tmpfs if mount is permitted, else a loop-mounted ext2
image.  Tests that need a real ENOSPC use it; they say which kind ran and skip only when
neither can be mounted (not root, no CAP_SYS_ADMIN, no loop devices)."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass
class SmallFs:
    path: str
    kind: str           # "tmpfs" or "loop ext2 image"

    def fill(self, name: str = "filler") -> str:
        """Write a file until the filesystem refuses another byte; return its path."""
        path = os.path.join(self.path, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for size in (1 << 16, 4096, 512, 1):
                chunk = b"\xff" * size
                while True:
                    try:
                        n = os.write(fd, chunk)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        break
                    if n < size:
                        break
        finally:
            os.close(fd)
        return path

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize


def _run(*args: str) -> bool:
    try:
        return subprocess.run(args, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextlib.contextmanager
def small_fs(base, size_kib: int = 1024):
    """Mount a filesystem of about `size_kib` KiB under `base`; yields a SmallFs or None."""
    mnt = os.path.join(str(base), "smallfs")
    os.makedirs(mnt, exist_ok=True)
    fs = None
    if _run("mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", mnt):
        fs = SmallFs(mnt, "tmpfs")
    elif shutil.which("mkfs.ext2"):
        image = os.path.join(str(base), "smallfs.img")
        with open(image, "wb") as f:
            f.truncate(size_kib * 1024)
        if _run("mkfs.ext2", "-q", "-F", "-m", "0", "-b", "1024", image) and \
                _run("mount", "-o", "loop", image, mnt):
            fs = SmallFs(mnt, "loop ext2 image")
            lost = os.path.join(mnt, "lost+found")
            if os.path.isdir(lost):
                os.rmdir(lost)
    try:
        yield fs
    finally:
        if fs is not None:
            _run("umount", "-l", mnt)
