"""Run a `lanner` tool with its stderr on a pseudo-terminal, as a user at a terminal would: the
tools draw progress bars only there."""
from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import tempfile
import termios


def run_on_terminal(argv: list[str], cwd=None, columns: int = 80,
                    whole: bool = False) -> tuple[int, bytes, bytes]:
    """Run `argv` with stderr on a `columns`x24 pseudo-terminal: (status, stdout, terminal).
    stdout goes to a file, so a long output never waits for a reader; `whole`: stdin and stdout
    are the terminal too, as from a user's shell (stdout then comes back empty)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    stdout = tempfile.TemporaryFile()
    proc = subprocess.Popen(argv, stdout=slave if whole else stdout, stderr=slave,
                            stdin=slave if whole else subprocess.DEVNULL, cwd=cwd, close_fds=True)
    os.close(slave)
    seen = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:                 # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    code = proc.wait(60)
    stdout.seek(0)
    out = stdout.read()
    stdout.close()
    return code, out, seen


def run_on_a_terminal(args: list[str]) -> tuple[int, bytes, bytes]:
    """Run `lanner ARGS` with stderr on an 80x24 pseudo-terminal (run_on_terminal)."""
    return run_on_terminal([sys.executable, "-m", "lanner.cli", *args])
