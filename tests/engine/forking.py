"""Run a function in a forked child and get its result back (the ring and shm tests)."""
from __future__ import annotations

import os
import pickle
import select
import traceback

CHILD_TIMEOUT = 30.0    # safety net for a hung peer; nothing waits for it in a passing run


def in_child(fn, *args) -> tuple[int, int]:
    """Run fn(*args) in a forked child; its return value (or traceback) comes
    back pickled through a pipe, read by `child_result`."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:                                           # pragma: no cover - child
        code = 0
        try:
            os.close(rfd)
            result = ("ok", fn(*args))
        except BaseException:
            result, code = ("error", traceback.format_exc()), 1
        try:
            with os.fdopen(wfd, "wb") as f:
                pickle.dump(result, f)
        finally:
            os._exit(code)
    os.close(wfd)
    return pid, rfd


def child_result(pid: int, rfd: int):
    with os.fdopen(rfd, "rb") as f:
        assert select.select([f], [], [], CHILD_TIMEOUT)[0], "child did not answer"
        data = f.read()
    _, status = os.waitpid(pid, 0)
    kind, value = pickle.loads(data) if data else ("error", f"child died, status {status}")
    assert kind == "ok", value
    assert os.waitstatus_to_exitcode(status) == 0
    return value
